"""Whether and how a run resumes, decided before anything is written or loaded.

``plan_resume`` finds the newest intact checkpoint (skipping damaged ones, each named in one line),
compares the settings it was trained with against this start's (``config/resume.py``) and returns a
:class:`ResumePlan`: where to resume from and which safe changes apply. A refused change, a run
directory that holds checkpoints without ``recover.mode=auto``, or checkpoints that are all damaged
raise :class:`UserError` before the run writes anything, as does one whose recorded actor weights are
not finite (``divergence.py``; an exploded norm is a warning). A checkpoint at or past
``total_train_steps`` means the run is already complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ...config.resume import Change, compare
from ...errors import UserError
from . import checkpoint as ckpt
from . import divergence, manifest


@dataclass
class ResumePlan:
    checkpoint: str | None = None
    """The checkpoint to resume from (None: a fresh start)."""
    step: int = 0
    changes: list[Change] = field(default_factory=list)
    """The settings that differ from the checkpoint's, all safe (they apply from the resumed step on)."""
    skipped: list[str] = field(default_factory=list)
    """One line per newer checkpoint skipped as damaged."""
    complete: bool = False
    """The checkpoint is at or past ``total_train_steps``: nothing is left to do."""
    unchecked: bool = False
    """The checkpoint predates recorded settings: changes could not be checked."""
    warnings: list[str] = field(default_factory=list)
    """What the checkpoint's recorded weights suggest (an exploded norm, ``divergence.py``)."""


def settings_of(cfg: Any) -> dict:
    """The run's configuration as plain JSON data (what a checkpoint records)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def plan_resume(run_dir: str, cfg: Any) -> ResumePlan:
    """See the module docstring; ``cfg`` is the run's ``TrainerConfig``."""
    complete = ckpt.checkpoint_dirs(run_dir)
    if not complete:
        return ResumePlan()
    if cfg.recover.mode not in ("auto", "on"):
        raise UserError(f"{run_dir} already holds checkpoints of an earlier run ({complete[-1][1]}). Resume it with "
                        "recover.mode=auto, or start a new run with another trial_name.")
    path, skipped = ckpt.resumable(run_dir)
    if path is None:
        raise UserError("every checkpoint of this run is damaged, so it cannot resume: " + "; ".join(skipped)
                        + ". Start a new run with another trial_name (or actor.path=<a checkpoint's actor directory> "
                        "to start from weights you trust).")
    step = int(os.path.basename(path).split("_", 1)[1])
    plan = ResumePlan(checkpoint=path, step=step, skipped=skipped, warnings=_weight_warnings(complete, path))
    if not os.path.isfile(os.path.join(path, manifest.MANIFEST)):
        plan.warnings.append(f"{path} has no {manifest.MANIFEST} (written by an older version, or copied without "
                             "it): its files cannot be checked for damage, so its weights are checked once loaded.")
    recorded = os.path.join(path, ckpt.SETTINGS)
    if os.path.isfile(recorded):
        with open(recorded) as f:
            plan.changes = compare(json.load(f), settings_of(cfg), defaults=settings_of(type(cfg)()))
    else:
        plan.unchecked = True
    refused = [c for c in plan.changes if not c.safe]
    if refused:
        lines = "\n".join(f"  - {c.line()}" for c in refused)
        raise UserError(f"recover.mode=auto: {path} was trained with other settings, which a resume cannot change:\n"
                        f"{lines}\nNothing was changed on disk. Resume with the old values, start a new run (another "
                        "trial_name), or start a fresh run from these weights in a new run directory with "
                        f"actor.path={path}/actor.")
    plan.complete = bool(cfg.total_train_steps) and step >= cfg.total_train_steps
    return plan


def _weight_warnings(checkpoints: list[tuple[int, str]], path: str) -> list[str]:
    """Refuse a checkpoint with non-finite actor weights; a warning for one whose norm exploded."""
    wrong = next((w for _, p, w in divergence.judged(checkpoints) if p == path), None)
    if wrong is None:
        return []
    advice = divergence.how_to_resume_from(divergence.last_healthy(checkpoints, path), checkpoints, path)
    if "not all finite" in wrong:
        raise UserError(f"recover.mode=auto: {path} cannot be resumed: {wrong} (recorded when it was saved), so "
                        f"every step from it would be non-finite. {advice}")
    return [f"{path} may have diverged: {wrong}. If the first steps after this resume have a non-finite loss, "
            f"resume from an earlier checkpoint instead. {advice}"]
