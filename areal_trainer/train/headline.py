"""The final lines about the held-out evaluation, from the run's metrics records.

* **Accuracy**, when every evaluation reported one (a verifier, ``train/evaluate.py``):
  ``held-out accuracy: 29.8% at step 0 (before RL) -> 57.2% at step 150 (+27.4 points)``.
* Otherwise **the mean reward**, named for what it is, with why there is no accuracy and how to get one:
  ``held-out mean reward (reward model): -0.192 at step 0 (before RL) -> -0.192 at step 2 (+0.000; no
  verifier: ...)``.
* With a teacher, **the reverse KL to it**: ``held-out reverse KL to the teacher: 0.352 at step 0 (before
  distillation) -> 0.319 at step 2 (nats per answer token)``; first for pure distillation, whose
  objective it is.

The first evaluation is called "before RL", "before distillation" (pure distillation) or "before training"
(RL with a teacher) when it ran at step 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..tracking.plot import held_out_kind


def phase(distill) -> str:
    """What the run trains by, as the lines name it: ``RL``, ``distillation`` (pure) or ``training`` (both)."""
    if distill is None:
        return "RL"
    return "distillation" if distill.pure else "training"


def headline(records: Sequence[dict], verifier, *, trains_by: str = "RL") -> tuple[list[str], dict[str, float]]:
    """The lines to print and the numbers for the run's result (``accuracy_before``/``_after``,
    ``reward_before``/``_after`` or ``reverse_kl_before``/``_after``). ``verifier``: the bound
    ``VerifierSpec`` (its ``what`` and ``note`` name a mean reward), or None."""
    held_out, numbers = [], {}
    kind = held_out_kind(records)
    if kind == "accuracy":
        (s0, a), (s1, b) = _ends([r for r in records if "eval/accuracy" in r], "eval/accuracy")
        numbers.update(accuracy_before=a, accuracy_after=b)
        held_out.append(f"held-out accuracy: {100 * a:.1f}% at step {s0}{_before(s0, trains_by)} -> {100 * b:.1f}% "
                        f"at step {s1} ({100 * (b - a):+.1f} points)")
    elif kind == "reward":
        (s0, a), (s1, b) = _ends([r for r in records if "eval/reward" in r], "eval/reward")
        what = verifier.what if verifier is not None else "reward"
        note = verifier.note if verifier is not None else "no verifier"
        numbers.update(reward_before=a, reward_after=b)
        held_out.append(f"held-out mean reward ({what}): {a:.3f} at step {s0}{_before(s0, trains_by)} -> {b:.3f} at "
                        f"step {s1} ({b - a:+.3f}; {note})")
    kl = [r for r in records if "eval/distill/reverse_kl" in r]
    if kl:
        (s0, a), (s1, b) = _ends(kl, "eval/distill/reverse_kl")
        numbers.update(reverse_kl_before=a, reverse_kl_after=b)
        line = (f"held-out reverse KL to the teacher: {a:.3f} at step {s0}{_before(s0, trains_by)} -> {b:.3f} at "
                f"step {s1} (nats per answer token)")
        held_out = [line, *held_out] if trains_by == "distillation" else [*held_out, line]
    return held_out, numbers


def _ends(records: Sequence[dict], key: str) -> tuple[tuple[int, float], tuple[int, float]]:
    return (records[0]["step"], records[0][key]), (records[-1]["step"], records[-1][key])


def _before(step: int, trains_by: str) -> str:
    return f" (before {trains_by})" if step == 0 else ""
