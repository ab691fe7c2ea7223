"""The run's record of how it was started: ``.hydra/config.yaml`` (the resolved configuration),
``overrides.yaml`` and ``hydra.yaml`` of the first start, then one entry per resume in
``.hydra/resumes.yaml`` (when, from which checkpoint, with which overrides, and the settings that
changed). Hydra's own writing of ``.hydra/`` is off (``hydra.output_subdir: null``): the trainer writes
the record only once a start is accepted, so a refused resume leaves the first start's record as it was.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from typing import Any

import yaml

from ..errors import UserError
from . import space
from .space import free_space

SUBDIR = ".hydra"
RESUMES = "resumes.yaml"


def _write(path: str, text: str) -> None:
    """Write ``path`` whole (a temporary file renamed over it), or raise ``UserError`` naming it and the free
    space, with the temporary file removed and ``path`` as it was."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise UserError(f"cannot write the run's record {path}: {type(e).__name__}: {' '.join(str(e).split())[:200]}. "
                        f"Free space there: {free_space(path)}; it needs {len(text.encode()) / 2**20:.3f} MiB. "
                        "Nothing was trained yet: free some space and start again.") from None


def write_start(run_dir: str, config: Any, overrides: list[str], hydra_config: Any = None) -> None:
    """The first start's record (``config`` is the composed OmegaConf config)."""
    from omegaconf import OmegaConf

    d = os.path.join(run_dir, SUBDIR)
    os.makedirs(d, exist_ok=True)
    _write(os.path.join(d, "config.yaml"), OmegaConf.to_yaml(config, resolve=True))
    _write(os.path.join(d, "overrides.yaml"), yaml.safe_dump(list(overrides), sort_keys=False))
    if hydra_config is not None:
        try:
            _write(os.path.join(d, "hydra.yaml"), OmegaConf.to_yaml(hydra_config))
        except Exception:  # noqa: BLE001 - Hydra's own settings are informative only
            pass


def append_resume(run_dir: str, *, checkpoint: str, overrides: list[str], changes: list, skipped: list[str]) -> None:
    """One entry in ``.hydra/resumes.yaml`` for an accepted resume."""
    d = os.path.join(run_dir, SUBDIR)
    os.makedirs(d, exist_ok=True)
    entry = {"at": datetime.datetime.now().isoformat(timespec="seconds"), "checkpoint": checkpoint,
             "overrides": list(overrides),
             "changes": {c.key: {"from": _plain(c.old), "to": _plain(c.new)} for c in changes}}
    if skipped:
        entry["skipped_damaged"] = list(skipped)
    try:
        space.append(os.path.join(d, RESUMES), [yaml.safe_dump([entry], sort_keys=False)])
    except space.AppendError as e:
        raise UserError(f"{e.strerror} Nothing was resumed yet: free some space and resume again.") from None


def resumes(run_dir: str) -> list[dict]:
    """The resume entries recorded so far."""
    path = os.path.join(run_dir, SUBDIR, RESUMES)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or []


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)
