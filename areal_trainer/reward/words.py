"""Short-answer rewards: the answer is one word (a colour, a shape, yes or no), as in the built-in picture
task (``builtin:squares``, ``data/pictures.py``)."""

from __future__ import annotations

import re

from . import completion_text

WORD = re.compile(r"[A-Za-z]+")


def first_word_reward(prompt, completion: str | list[dict], answer: str | None, **kwargs) -> float:
    """1.0 if the completion's first word equals the reference answer (letters only, any case), else 0.0; other
    keyword arguments (the row's columns, its images) are accepted and ignored."""
    found = WORD.search(completion_text(completion) or "")
    gold = WORD.search(answer or "")
    return 1.0 if found and gold and found.group().lower() == gold.group().lower() else 0.0


first_word_reward.verdict = "binary"  # 1 right, 0 wrong: held-out accuracy comes from it (reward.VERDICT)
