"""No run directory is left behind by a run that fails before training (a configuration or user error).

Hydra creates the run directory, with ``.hydra/`` and an empty ``<job>.log``, before the task starts
(the log then receives the console lines, ``tracking/runlog.py``).
``RunDirGuard`` (a Hydra callback named in ``conf/config.yaml``) notes, just before that, which
directories of the run's path already exist; ``remove_if_unused`` then removes the ones this
invocation created, but only while the run directory holds nothing but those Hydra files (never one
with checkpoints or metrics, such as a resumed run's). Single runs only; sweep job directories stay.
"""

from __future__ import annotations

import os
import shutil

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from .runlog import bytes_written

HYDRA_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}
TINY_LOG_BYTES = 4096
"""A job log this small holds at most a few start-up lines (not counting this process's console lines,
which a run failing at start-up writes too: its warnings and the error)."""

_CREATED: dict[str, tuple[str, str]] = {}
"""Run directory (absolute) -> (its deepest ancestor that existed before this invocation, the job log's name)."""


class RunDirGuard(Callback):
    """Records, before Hydra creates it, whether the run directory and its parents already exist."""

    def on_run_start(self, config, **kwargs) -> None:
        _CREATED.clear()
        try:
            run_dir = os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir")))
            log = f"{OmegaConf.select(config, 'hydra.job.name') or '__main__'}.log"
        except Exception:  # noqa: BLE001 - an unresolvable directory: Hydra reports it, nothing to guard
            return
        existing = run_dir
        while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        if existing != run_dir:
            _CREATED[run_dir] = (existing, log)


def _only_hydra_files(run_dir: str, log: str) -> bool:
    for entry in os.scandir(run_dir):
        if entry.name == ".hydra" and entry.is_dir(follow_symlinks=False):
            if any(e.name not in HYDRA_FILES or not e.is_file(follow_symlinks=False) for e in os.scandir(entry.path)):
                return False
        elif entry.name == LOCK_FILE:
            continue
        elif not (entry.name == log and entry.is_file(follow_symlinks=False)
                  and entry.stat().st_size - bytes_written(entry.path) <= TINY_LOG_BYTES):
            return False
    return True


def remove_if_unused(run_dir: str) -> bool:
    """Remove ``run_dir`` and the parents this invocation created, if it holds only Hydra's own files."""
    run_dir = os.path.abspath(run_dir)
    if run_dir not in _CREATED:
        return False
    keep, log = _CREATED[run_dir]
    if not os.path.isdir(run_dir) or not _only_hydra_files(run_dir, log):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = os.path.dirname(run_dir)
    while parent != keep and parent.startswith(keep.rstrip(os.sep) + os.sep):
        try:
            os.rmdir(parent)  # only if empty: another run may share it
        except OSError:
            break
        parent = os.path.dirname(parent)
    return not os.path.exists(run_dir)


LOCK_FILE = ".lock"
LOCK_HELD_ENV = "AREAL_TRAINER_RUN_LOCK"
"""Set by a process that holds a run directory's lock for the processes it starts (the ranks of
``scheduler.type``), which then share it instead of taking it again."""


class RunDirInUse(RuntimeError):
    """Another live run holds the run directory."""


class RunLock:
    """One run per directory: an exclusive ``fcntl`` lock on ``<run dir>/.lock``, holding the owner's PID.

    The operating system releases the lock when its process ends, however it ends (a crash or a
    SIGKILL included), so a stale lock file never blocks a later run. Processes of one job share the
    lock: ranks other than 0, and processes started by the holder (``LOCK_HELD_ENV``), do not take it."""

    def __init__(self, run_dir: str):
        self.run_dir = os.path.abspath(run_dir)
        self.path = os.path.join(self.run_dir, LOCK_FILE)
        self.fd: int | None = None

    def shared(self) -> bool:
        """Whether this process belongs to a job whose lock another process holds."""
        return os.environ.get(LOCK_HELD_ENV) == self.run_dir or os.environ.get("RANK", "0") != "0"

    def acquire(self) -> RunLock:
        """Take the lock, or raise :class:`RunDirInUse` naming the PID that holds it (writing nothing)."""
        import fcntl

        if self.shared():
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirInUse(f"{self.run_dir} is in use by another run (PID {holder}), which holds "
                              f"{self.path}. Wait for it to end, or start this run with another trial_name.") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        os.environ[LOCK_HELD_ENV] = self.run_dir  # inherited by the processes this run starts
        return self

    @property
    def owned(self) -> bool:
        """Whether this process took the lock (it starts the run), rather than sharing its job's."""
        return self.fd is not None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock; the file stays (removing it would race with a waiting run)
            self.fd = None
            if os.environ.get(LOCK_HELD_ENV) == self.run_dir:
                del os.environ[LOCK_HELD_ENV]
