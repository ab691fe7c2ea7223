"""The trainer's side of a box's life, around the judge: its scratch directory (made per call, watched
while a Landlock box runs, removed after it) and its end (killed and reaped, never left behind).

The namespace box writes into a private tmpfs of :data:`~areal_trainer.reward.box.namespaces.SCRATCH_MB`
MiB and :data:`~areal_trainer.reward.box.namespaces.SCRATCH_FILES` entries, where the kernel enforces
both. The Landlock box (``box/landlock.py``) writes into its scratch directory on the host's filesystem,
where nothing bounds the total, so a :class:`Watchdog` thread measures it every
:data:`WATCH_INTERVAL_S` seconds and SIGKILLs the box's process group once it holds more than the same
bounds. What it counts: every entry under the directory (without following links); the blocks of every
regular file there, and of every file the box holds open that has no name left on that filesystem
(deleted while open, or made with ``O_TMPFILE``). A directory it cannot read ends the box too (the box
cannot change modes, so only code that made it so on purpose has one).

What can pass the bound, and by how much: what the code writes between two looks, that is in one
interval plus the time a look takes (at most :data:`SCRATCH_FILES` ``stat`` calls, about 10 ms); at a
page-cache write speed of 1-2 GB/s, some 10-40 MiB past the bound (66-83 MiB were seen when killed on a
2-core test machine). Besides: pages of a deleted file kept only as a shared mapping (no name, no
descriptor), which the address-space limit ``memory_mb`` bounds. All of it goes with the scratch
directory when the call ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import threading

from .box.namespaces import SCRATCH_FILES, SCRATCH_MB

WATCH_INTERVAL_S = 0.01
"""How often the watchdog measures a Landlock box's scratch directory."""
REAP_S = 1.0
"""How long to wait for the namespace box's outer process to reap the killed box before killing it too."""


class Watchdog:
    """Measures ``scratch`` (and the files process ``pid`` holds open) from a thread until :meth:`stop`;
    over ``max_bytes`` or ``max_entries`` it kills process group ``pid`` and keeps the reason."""

    def __init__(self, scratch: str, pid: int, *, max_bytes: int = SCRATCH_MB << 20,
                 max_entries: int = SCRATCH_FILES, interval_s: float = WATCH_INTERVAL_S):
        self.scratch, self.pid, self.max_bytes, self.max_entries = scratch, pid, max_bytes, max_entries
        self.interval_s = interval_s
        self.reason: str | None = None
        self.peak_bytes = self.peak_entries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="areal-box-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                used, entries = usage(self.scratch, self.pid, self.max_entries)
            except FileNotFoundError:
                return  # the box has ended (its /proc entry is gone)
            except OSError:  # a directory made unreadable, a box made undumpable: only hostile code does that
                self._kill("its scratch directory could not be measured")
                return
            self.peak_bytes, self.peak_entries = max(self.peak_bytes, used), max(self.peak_entries, entries)
            if used > self.max_bytes or entries > self.max_entries:
                self._kill(f"its scratch directory passed {self.max_bytes >> 20} MiB or {self.max_entries} entries")
                return
            if self._stop.wait(self.interval_s):
                return

    def _kill(self, reason: str) -> None:
        if not self._stop.is_set():  # after stop() the process may be reaped: its pid is no longer ours
            self.reason = reason
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def stop(self) -> None:
        """End the watch (before the box is reaped, so that no kill can reach a reused pid)."""
        self._stop.set()
        self._thread.join()


def usage(scratch: str, pid: int, max_entries: int) -> tuple[int, int]:
    """Bytes allocated to the regular files under ``scratch`` and to those process ``pid`` (or a child of
    it) holds open without a name on its filesystem (each file once), and the number of entries under ``scratch``,
    counted up to ``max_entries + 1``. Raises ``PermissionError`` for a directory it cannot read,
    ``FileNotFoundError`` once ``pid`` is gone."""
    seen: set[tuple[int, int]] = set()
    used = entries = 0

    def count(st: os.stat_result) -> None:
        nonlocal used
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            used += st.st_blocks * 512

    pending = [scratch]
    while pending and entries <= max_entries:
        try:
            with os.scandir(pending.pop()) as found:
                for entry in found:
                    entries += 1
                    if entries > max_entries:
                        break
                    with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            pending.append(entry.path)
                        count(st)
        except FileNotFoundError:
            continue
    device = os.stat(scratch).st_dev
    # The box, or its one child where a namespace attempt forked before it failed and Landlock took over.
    for box in (pid, *children(pid)):
        try:
            fds = os.listdir(f"/proc/{box}/fd")
        except FileNotFoundError:
            if box == pid:
                raise
            continue
        for fd in fds:
            with contextlib.suppress(FileNotFoundError):  # closed meanwhile
                st = os.stat(f"/proc/{box}/fd/{fd}")  # follows the link to the open file itself
                if st.st_nlink == 0 and st.st_dev == device:  # a named one is under scratch, or not the box's
                    count(st)
    return used, entries


def kill_group(proc: subprocess.Popen) -> None:
    """End the box and reap it. With namespaces the box is the one child of ``proc`` (which only waits
    for it): kill that child first, so that ``proc`` reaps it and no orphan zombie is left to the
    machine's init; then SIGKILL the whole process group (anything left) and reap ``proc``."""
    found = children(proc.pid)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if found:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=REAP_S)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children, as the kernel lists them (never as the box says)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def remove_tree(path: str) -> bool:
    """Delete the scratch directory, also where the code took permissions away from what it made;
    whether it is gone."""
    for root, dirs, _files in os.walk(path):  # top-down: each directory is opened up before the walk enters it
        for name in dirs:
            sub = os.path.join(root, name)
            if not os.path.islink(sub):  # chmod follows links: never touch what a link points to
                with contextlib.suppress(OSError):
                    os.chmod(sub, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)
