"""Verifiable rewards for math answers (GSM8K and the built-in arithmetic task).

The final answer of a completion is, in order of preference: the content of the last
``\\boxed{...}``, the number after the last ``####``, or the last number in the text. It earns 1.0
when it equals the reference answer (the number after ``####`` in the dataset's ``answer``),
compared as exact rationals, so ``0.5`` matches ``1/2`` and ``1,000`` matches ``1000``.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_HASHES = re.compile(r"####\s*([^\n]*)")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer string of a completion (see module docstring), or None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASHES.findall(text)
    if hashes and _NUMBER.search(hashes[-1]):
        return _NUMBER.search(hashes[-1]).group(0)
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def to_number(text: str | None) -> Fraction | None:
    """Parse ``12``, ``-3.5``, ``1,000``, ``3/4``, ``$12``, ``12.`` into an exact Fraction."""
    if text is None:
        return None
    s = text.strip().strip("$").replace(",", "").rstrip(".").strip()
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
    s = re.sub(r"\\(?:d|t)?frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", s)
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def reference_answer(answer: str) -> str:
    """The gold answer of a GSM8K-style solution (text after the last ``####``, else all of it)."""
    hashes = _HASHES.findall(answer)
    return hashes[-1].strip() if hashes else answer.strip()


def gsm8k_reward_fn(prompt: str, completion: str, answer: str, **kwargs) -> float:
    """1.0 if the completion's final answer equals the reference answer numerically, else 0.0."""
    gold = to_number(reference_answer(answer))
    pred = to_number(extract_answer(completion))
    if gold is None or pred is None:
        return 0.0
    return 1.0 if pred == gold else 0.0
