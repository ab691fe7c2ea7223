"""Diverged checkpoints: weights recorded when saved, judged on resume, named when a resumed run stops.

Every checkpoint's ``COMPLETE`` marker records, per model, whether its weights are all finite and their
global L2 norm (``checkpoint.weight_stats``). A run that diverges (a learning rate far too high) can still
write a checkpoint whose weights are finite but have exploded, after which every step's loss is
non-finite; resuming it with a sane learning rate then stops again. So:

* resuming a checkpoint whose recorded actor weights are not finite is refused before anything loads,
  naming the last checkpoint whose weights are healthy and how to resume from it;
* resuming one whose actor weight norm is more than :data:`EXPLODED` times that of the checkpoint before
  it is a warning naming both;
* a resumed run whose every step since the resume had a non-finite loss stops saying that the
  checkpoint it resumed is the likely cause when its recorded weights are not healthy
  (:func:`resumed_diverged`), with the last healthy one; a stop never advises resuming such a checkpoint.

"Healthy": finite weights, and a norm at most :data:`EXPLODED` times that of the healthy checkpoint
before it (for the first one, the norm when the run began, which every marker records). Checkpoints
written before markers recorded weights count as healthy (nothing is known against them).
"""

from __future__ import annotations

import json
import math
import os

from .checkpoint import MARKER

EXPLODED = 10.0
"""A checkpoint whose actor weight norm is above this multiple of the previous healthy one's has exploded."""


def _marker(path: str) -> dict:
    try:
        with open(os.path.join(path, MARKER)) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def recorded(path: str, model: str = "actor") -> dict | None:
    """``model``'s recorded stats in the checkpoint at ``path`` (None when its marker records none)."""
    stats = (_marker(path).get("weights") or {}).get(model)
    return stats if isinstance(stats, dict) and "finite" in stats and "norm" in stats else None


def start_norm(path: str) -> float | None:
    """The actor's weight norm when the run that wrote ``path`` began (None when not recorded)."""
    norm = _marker(path).get("start_norm")
    return float(norm) if isinstance(norm, (int, float)) and norm > 0 else None


def judged(checkpoints: list[tuple[int, str]]) -> list[tuple[int, str, str | None]]:
    """``(step, path, what is wrong or None)`` for each checkpoint (oldest first), see the module docstring."""
    out, reference = [], None
    first = start_norm(checkpoints[0][1]) if checkpoints else None
    if first is not None:
        reference = ("the run's start", first)
    for step, path in checkpoints:
        stats, wrong = recorded(path), None
        if stats is not None and not stats["finite"]:
            wrong = "its actor weights are not all finite"
        elif stats is not None and reference is not None and stats["norm"] > EXPLODED * reference[1]:
            wrong = (f"its actor weight norm, {stats['norm']:.3g}, is {stats['norm'] / reference[1]:.3g}x that of "
                     f"{reference[0]} ({reference[1]:.3g})")
        if wrong is None and stats is not None and stats["norm"] > 0:
            reference = (path, stats["norm"])
        out.append((step, path, wrong))
    return out


def last_healthy(checkpoints: list[tuple[int, str]], before: str) -> str | None:
    """The newest healthy checkpoint older than ``before``."""
    steps = {p: s for s, p in checkpoints}
    older = [(s, p) for s, p, wrong in judged(checkpoints) if wrong is None and s < steps.get(before, math.inf)]
    return older[-1][1] if older else None


def how_to_resume_from(healthy: str | None, checkpoints: list[tuple[int, str]], bad: str) -> str:
    """The sentence telling how to go back to ``healthy`` (or to start again when there is none)."""
    if healthy is None:
        return ("No earlier checkpoint is healthy: start a new run (another trial_name) with a lower "
                "actor.optimizer.lr.")
    kept = next(s for s, p in checkpoints if p == healthy)
    newer = [p for s, p in checkpoints if s > kept]
    return (f"The last healthy checkpoint is {healthy}: remove the newer ones (rm -r {' '.join(newer) or bad}) "
            "and resume again with recover.mode=auto and a lower actor.optimizer.lr.")


def resumed_diverged(checkpoints: list[tuple[int, str]], resumed: str) -> str:
    """The stop message's sentence for a resumed run that had nothing but non-finite steps since ``resumed``."""
    stats = recorded(resumed)
    norm = f" (actor weight norm {stats['norm']:.3g})" if stats else ""
    healthy = last_healthy(checkpoints, resumed)
    return (f"Every step since resuming from {resumed}{norm} had a non-finite loss: that checkpoint's weights have "
            f"likely diverged, whatever the learning rate now. {how_to_resume_from(healthy, checkpoints, resumed)}")
