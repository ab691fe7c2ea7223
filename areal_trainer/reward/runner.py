"""Call the configured reward function on every sample, surviving a function that raises.

A sample whose reward raised gets ``reward.error_value`` and is flagged; answer checks that ran out
of time (``reward/verify.py``) are counted per sample too, so a workflow can attach both counts to
the trajectory group they belong to. When more than ``reward.max_error_fraction`` of one batch
raised, the run stops with a message naming the function and one offending input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..errors import UserError
from . import verify


class Scores(NamedTuple):
    """Per sample: the reward, whether the reward function raised, and its answer-check timeouts."""

    rewards: list[float]
    errors: list[int]
    timeouts: list[int]

    def stats(self, lo: int = 0, hi: int | None = None) -> dict[str, float]:
        """``reward_errors`` and ``verify_timeouts`` of samples ``lo:hi`` (a trajectory group's stats)."""
        return {"reward_errors": float(sum(self.errors[lo:hi])), "verify_timeouts": float(sum(self.timeouts[lo:hi]))}


class RewardRunner:
    def __init__(self, fn: Callable, *, name: str, kwargs: dict, error_value: float, max_error_fraction: float):
        self.fn, self.name, self.kwargs = fn, name, dict(kwargs)
        self.error_value, self.max_error_fraction = float(error_value), float(max_error_fraction)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]) -> Scores:
        scores, example = Scores([], [], []), None
        for p, c, a in zip(prompts, completions, answers):
            before = verify.thread_timeouts()
            try:
                scores.rewards.append(float(self.fn(p, c, a, **self.kwargs)))
                scores.errors.append(0)
            except Exception as e:  # noqa: BLE001 - any failure of user code becomes error_value
                scores.rewards.append(self.error_value)
                scores.errors.append(1)
                if example is None:
                    example = (c, a, e)
            scores.timeouts.append(verify.thread_timeouts() - before)
        errors = sum(scores.errors)
        if scores.rewards and errors / len(scores.rewards) > self.max_error_fraction:
            c, a, e = example
            raise UserError(
                f"reward.fn {self.name} raised on {errors} of {len(scores.rewards)} samples of one batch "
                f"(more than reward.max_error_fraction={self.max_error_fraction}). Example: completion={c[:200]!r}, "
                f"answer={a[:100]!r} -> {type(e).__name__}: {e}")
        return scores
