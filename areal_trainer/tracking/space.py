"""Appending to the run's history files without losing what they hold when the disk is full.

:func:`append` writes whole lines or nothing: a write that fails (a full disk, a quota, a permission
error) truncates the file back to its size before the append, so a half-written JSON line never
reaches ``metrics.jsonl`` or ``samples.jsonl``, and raises :class:`AppendError`, whose text is one line
naming the file, the reason, the free space and the size the write needed.
"""

from __future__ import annotations

import os
import shutil


class AppendError(OSError):
    """An append that did not happen (the file is as it was); its text is the one line to show."""


def free_space(path: str) -> str:
    """The free space of the file system holding ``path`` (a directory, or a file that may not exist yet), as
    ``12.3 MiB`` (``unknown`` if it cannot be read)."""
    where = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    try:
        return f"{shutil.disk_usage(where).free / 2**20:.1f} MiB"
    except OSError:
        return "unknown"


def is_full(path: str, below: int = 4096) -> bool:
    """Whether the file system holding the directory ``path`` has less than ``below`` bytes free (no next write
    fits); False where that cannot be read."""
    try:
        return shutil.disk_usage(path).free < below
    except OSError:
        return False


def append(path: str, lines: list[str]) -> None:
    """Append ``lines`` (each ending in a newline) to ``path`` whole, or raise :class:`AppendError`."""
    data = "".join(lines).encode("utf-8")
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    try:
        with open(path, "ab") as f:
            f.write(data)
            f.flush()
    except OSError as e:
        try:
            with open(path, "r+b") as f:
                f.truncate(size)
        except OSError:
            pass
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise AppendError(e.errno, f"cannot append to {path}: {type(e).__name__}: {why}. Free space there: "
                                   f"{free_space(path)}; the write needed {len(data) / 2**20:.3f} MiB. What the file "
                                   "held before is kept.") from None
