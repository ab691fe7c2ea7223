"""Call the configured reward function on every sample, surviving a function that raises.

A sample whose reward raised gets ``reward.error_value``; the count is reported. When more than
``reward.max_error_fraction`` of one batch raised, the run stops with a message naming the
function and one offending input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import UserError


class RewardRunner:
    def __init__(self, fn: Callable, *, name: str, kwargs: dict, error_value: float, max_error_fraction: float):
        self.fn, self.name, self.kwargs = fn, name, dict(kwargs)
        self.error_value, self.max_error_fraction = float(error_value), float(max_error_fraction)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]) -> tuple[list[float], int]:
        """(rewards, number of samples whose reward function raised)."""
        rewards, errors, example = [], 0, None
        for p, c, a in zip(prompts, completions, answers):
            try:
                rewards.append(float(self.fn(p, c, a, **self.kwargs)))
            except Exception as e:  # noqa: BLE001 - any failure of user code becomes error_value
                errors += 1
                rewards.append(self.error_value)
                if example is None:
                    example = (c, a, e)
        if rewards and errors / len(rewards) > self.max_error_fraction:
            c, a, e = example
            raise UserError(
                f"reward.fn {self.name} raised on {errors} of {len(rewards)} samples of one batch "
                f"(more than reward.max_error_fraction={self.max_error_fraction}). Example: completion={c[:200]!r}, "
                f"answer={a[:100]!r} -> {type(e).__name__}: {e}")
        return rewards, errors
