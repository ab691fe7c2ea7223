"""Fault injection for tests: kill the process at a named point, to make a narrow window reliable.

``AREAL_TRAINER_FAULT=<point>`` makes the process SIGKILL itself the first time it reaches
:func:`point` with that name; ``<point>@<n>`` the n-th time (counting from 1). Nothing happens when
the variable is unset, which is always the case outside tests. The points (grep ``faults.point``):

* ``checkpoint.before_marker``: a checkpoint's files and manifest are written, ``COMPLETE`` is not;
* ``checkpoint.before_rename``: the checkpoint is complete in its temporary directory;
* ``prune.after_marker``: an old checkpoint's ``COMPLETE`` is removed, its files are not yet;
* ``history.before_replace``: on resume, the kept part of ``metrics.jsonl`` is written to a
  temporary file that has not yet replaced the original;
* ``resume.after_restore``: a resumed run has loaded its checkpoint, before its first step;
* ``warmstart.before_marker``: the warm-start cache entry is written, not yet marked complete.

A SIGKILL is what a crash, the OOM killer or a preempted node does: no ``finally`` runs.
"""

from __future__ import annotations

import os
import signal

ENV = "AREAL_TRAINER_FAULT"
_SEEN: dict[str, int] = {}


def point(name: str) -> None:
    """Kill this process here if ``AREAL_TRAINER_FAULT`` names this point (see the module docstring)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    target, _, nth = wanted.partition("@")
    if target != name:
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] == (int(nth) if nth else 1):
        os.kill(os.getpid(), signal.SIGKILL)
