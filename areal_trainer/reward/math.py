"""Verifiable rewards for math answers (GSM8K and the built-in arithmetic task).

The final answer of a completion is, in order of preference: the content of the last
``\\boxed{...}``, the number after the last ``####``, or the last number in the text. The reference
answer is the text after the last ``####`` of the dataset's ``answer`` (else all of it).

Checking is two-tier:

1. **Exact numbers** (fast, no dependencies): when both answers are plain numbers (``12``,
   ``-3.5``, ``1,000``, ``3/4``, ``\\frac{3}{4}``, ``$12``), they are compared as exact rationals,
   so ``0.5`` matches ``1/2``. A percentage (``50%``, ``50\\%``) matches both ``50`` and ``0.5``.
2. **Symbolic** (``math-verify``): when either side is not a plain number (``\\sqrt{4}``,
   ``2\\sqrt{2}``, ``12 \\text{ apples}``), or when a mismatch rests only on the last-number guess
   in text that contains LaTeX (``$\\frac{1}{2}$`` ends in the digit 2), the library decides.

math-verify can hang on some answers (``\\boxed{9^{9^{9}}}`` asks sympy for a number with 370 million
digits, in one C-level call that never returns to Python). Its own time limits are switched off here;
the reward runs in a worker process whose call is killed after ``reward.timeout`` seconds
(``reward/pool.py``), which scores ``reward.timeout_value`` and is counted in ``reward/timeouts``.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

from . import completion_text

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?(?:\s*\\?%)?")
_HASHES = re.compile(r"####\s*([^\n]*)")
_PERCENT = re.compile(r"\s*\\?%$")
_LATEX_NOISE = (("\\$", ""), ("{,}", ","), ("\\,", ""), ("\\!", ""), ("\\ ", ""))


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


def _extract(text: str) -> tuple[str | None, str]:
    """(final answer string, where it came from: ``boxed``, ``hashes``, ``last`` or ``none``)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip(), "boxed"
    hashes = _HASHES.findall(text)
    if hashes and _NUMBER.search(hashes[-1]):
        return _NUMBER.search(hashes[-1]).group(0), "hashes"
    numbers = _NUMBER.findall(text)
    return (numbers[-1], "last") if numbers else (None, "none")


def extract_answer(text: str) -> str | None:
    """The final answer string of a completion (see module docstring), or None."""
    return _extract(text)[0]


def to_number(text: str | None) -> Fraction | None:
    """Parse ``12``, ``-3.5``, ``1,000``, ``3/4``, ``$12``, ``12.``, ``\\frac{3}{4}`` into an exact Fraction."""
    if text is None:
        return None
    s = text.strip()
    for old, new in _LATEX_NOISE:
        s = s.replace(old, new)
    s = s.strip("$").replace(",", "").rstrip(".").strip()
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
    s = re.sub(r"\\(?:d|t)?frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", s)
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def numeric_values(text: str | None) -> frozenset[Fraction]:
    """The values a plain-number answer may stand for: ``{x}``, ``{p, p/100}`` for ``p%``, or empty."""
    if text is None:
        return frozenset()
    stripped = _PERCENT.sub("", text.strip())
    if stripped != text.strip():
        p = to_number(stripped)
        return frozenset() if p is None else frozenset({p, p / 100})
    x = to_number(text)
    return frozenset() if x is None else frozenset({x})


def reference_answer(answer: str) -> str:
    """The gold answer of a GSM8K-style solution (text after the last ``####``, else all of it)."""
    hashes = _HASHES.findall(answer)
    return hashes[-1].strip() if hashes else answer.strip()


FLOAT_ROUNDING = 6
"""Decimal places math-verify rounds floats to before comparing them."""


class _DropDisabledTimeoutNotice(logging.Filter):
    """math-verify warns that its own timeout is disabled; the worker's deadline bounds the call instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


def _math_verify():
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropDisabledTimeoutNotice) for f in lg.filters):
            lg.addFilter(_DropDisabledTimeoutNotice())
    return math_verify


def equivalent(gold: str, prediction: str) -> bool:
    """Whether math-verify finds ``prediction`` (free text or LaTeX) equal to ``gold``; False when it cannot
    parse either or fails. No time limit of its own (see the module docstring).

    The gold answer is parsed as an expression, or as inline LaTeX when that finds nothing (bare
    ``\\frac{1}{2}``). The prediction is searched like a model's answer: ``\\boxed{}`` and anchored
    answers ("the final answer is ...") first, then the last expression.
    """
    mv = _math_verify()
    try:
        gold_parsed = mv.parse(gold, parsing_timeout=None) or mv.parse(f"${gold}$", parsing_timeout=None)
        pred_parsed = mv.parse(prediction, parsing_timeout=None)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(mv.verify(gold_parsed, pred_parsed, float_rounding=FLOAT_ROUNDING, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a malformed answer is a wrong answer, never a failed reward
        return False


def gsm8k_reward_fn(prompt, completion: str | list[dict], answer: str | None, **kwargs) -> float:
    """1.0 if the completion's final answer equals the reference answer, else 0.0 (other keyword arguments,
    such as the row's columns, are accepted and ignored). A conversational completion is read from its
    last message."""
    completion = completion_text(completion)
    gold_text = reference_answer(answer or "")
    if not completion or not completion.strip() or not gold_text:
        return 0.0
    pred_text, source = _extract(completion)
    gold, pred = numeric_values(gold_text), numeric_values(pred_text)
    if gold and pred:
        if gold & pred:
            return 1.0
        if source != "last" or "\\" not in completion:
            return 0.0  # two plain numbers that differ: no symbolic check can change that
    elif not any(c.isdigit() or c == "\\" for c in completion):
        return 0.0  # neither a number nor LaTeX: nothing math-verify could match
    return 1.0 if equivalent(gold_text, completion) else 0.0


gsm8k_reward_fn.verdict = "binary"  # 1 right, 0 wrong: held-out accuracy comes from it (reward.VERDICT)
