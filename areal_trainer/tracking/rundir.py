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
