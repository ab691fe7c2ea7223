"""Rewards: the reward functions' contract and their execution (``functions.py``, ``pool.py``,
``service.py``), reward models (``model.py``), scoring services (``remote.py``), code execution
(``code.py``) and the math answer checks (``math.py``)."""

VERDICT = "verdict"
"""The attribute by which a reward function says that its value is a verdict on the answer, right or
wrong, and how to read it (one of :data:`VERDICTS`). The held-out evaluation takes its accuracy from such
a function (``evaluator.verifier``); a function without it is a verifier only when the user names it, or
when it is the run's only reward source and returns nothing but 0 and 1 on the held-out set."""
VERDICTS = ("binary", "all_or_nothing")
"""``binary``: 1 for a right answer, 0 for a wrong one (correct when positive); ``all_or_nothing``: the
share of an answer's checks that pass, correct only when every check passes (the value 1)."""


def verdict_of(fn) -> str | None:
    """The verdict a reward function declares (its :data:`VERDICT` attribute), or None."""
    verdict = getattr(fn, VERDICT, None)
    return verdict if verdict in VERDICTS else None


def is_correct(values, verdict: str = "binary"):
    """Whether each value says "correct" under ``verdict``: positive (``binary``), or at least 1
    (``all_or_nothing``, every check passed). Works on numbers and tensors alike; NaN (no value) is
    never correct. ``binary`` on rewards is also ``reward/correct_frac``'s rule."""
    return values > 0 if verdict == "binary" else values >= 1


def completion_text(completion) -> str:
    """The text of a completion as reward functions receive it: a string as it is; for conversational
    rows (``[{"role": "assistant", "content": ...}, ...]``) the content of the last message."""
    if isinstance(completion, list):
        return str(completion[-1].get("content") or "") if completion else ""
    return completion or ""
