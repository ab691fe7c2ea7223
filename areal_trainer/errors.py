"""Errors shown to the user as one clear message (no traceback) by the command line, and the helpers
that word them. The bottom layer of the package: it imports nothing of it.

The command line prints ``Error: <message>`` and exits 1 for a :class:`UserError` (which includes
:class:`PluginOutputError`), a :class:`ConfigError` or a ``plugins.PluginError``. With the
environment variable ``AREAL_TRAINER_DEBUG=1`` it shows the full traceback of these errors too
(with any chained cause): they are raised where the problem is found, so the traceback leads to
the check, and through it to the call of the user's function.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any


class UserError(RuntimeError):
    """A problem the user can fix (bad path, bad data row, failing plugin); the message says how."""


class PluginOutputError(UserError, ValueError, TypeError):
    """What a user function (a plugin named by import path) returned breaks its contract: a wrong type,
    shape, device or dtype, non-finite values, an input modified in place, a loss without a gradient.

    The message starts with the plugin's label, its config key and import path (``actor.advantage.estimator
    (mypkg.adv.fn): ...``), then names the field, what is wrong and the fix. It is also a ``ValueError``
    and a ``TypeError``, the classes these checks raised before, so callers catching those still do.
    """


class ConfigError(ValueError):
    """One or more problems in a configuration; ``problems`` lists them all."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        n = len(self.problems)
        super().__init__(f"{n} configuration problem{'s' if n != 1 else ''}:\n{lines}")


def is_integer(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (YAML's ``true`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def number_in(key: str, value: Any, low: float | None = None, high: float | None = None, *, open_low: bool = False,
              open_high: bool = False, integer: bool = False, finite: bool = False, nullable: bool = False,
              unit: str = "", note: str = "", high_label: str | None = None, kind: str | None = None) -> list[str]:
    """A problem unless ``value`` is a number within the bounds (or None, when ``nullable``): the one wording of
    every bound of the package. ``low`` / ``high``: the bounds, inclusive unless ``open_low`` / ``open_high``;
    ``integer``: an ``int`` (not a bool); ``finite``: no inf or NaN. The message names the key, the value and the
    range: ``k: got -1; must be > 0 seconds or null (note).`` ``unit`` follows a one-sided bound; ``high_label``
    shows the upper bound by its source (``max_new_tokens=8``); ``kind`` replaces the words naming the type
    (``an integer ``, ``a finite number ``)."""
    if value is None and nullable:
        return []
    typed = is_integer(value) if integer else is_number(value) and (not finite or math.isfinite(value))
    if typed and (low is None or (value > low if open_low else value >= low)) and (
            high is None or (value < high if open_high else value <= high)):
        return []
    words = kind if kind is not None else "an integer " if integer else "a finite number " if finite else ""
    shown_high = high if high_label is None else high_label
    if low is not None and high is not None:
        bound = f"in {'(' if open_low else '['}{low}, {shown_high}{')' if open_high else ']'}"
    elif low is not None:
        bound = f"{'>' if open_low else '>='} {low}{f' {unit}' if unit else ''}"
    else:
        bound = f"{'<' if open_high else '<='} {shown_high}{f' {unit}' if unit else ''}"
    return [f"{key}: got {value!r}; must be {words}{bound}{' or null' if nullable else ''}"
            f"{f' ({note})' if note else ''}."]


def integer_at_least(key: str, value: Any, low: int, *, nullable: bool = False, note: str = "") -> list[str]:
    """A problem unless ``value`` is an integer >= ``low`` (or None, when ``nullable``): a count's bound
    (:func:`number_in`). ``note``: what a value means, added in parentheses (e.g. ``0 writes no file``)."""
    return number_in(key, value, low, integer=True, nullable=nullable, note=note, kind="" if low == 1 else None)


def one_of(key: str, value: Any, choices: Iterable[Any], fix: str = "") -> list[str]:
    """A problem if ``value`` is not among ``choices`` (with a did-you-mean for strings)."""
    choices = list(choices)
    if value in choices:
        return []
    shown = ", ".join("null" if c is None else repr(c) for c in choices)
    hint = suggest(value, [c for c in choices if isinstance(c, str)])
    msg = f"{key}: got {value!r}; must be one of {shown}.{hint}"
    return [msg + (f" {fix}" if fix else "")]


def closest(word: Any, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (``word`` itself when it is one), or None when none is close: the one
    measure of "close" behind every "did you mean" of the package."""
    if not isinstance(word, str):
        return None
    candidates = list(candidates)
    if word in candidates:
        return word
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return close[0] if close else None


def suggest(word: Any, candidates: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest candidate, or an empty string."""
    close = closest(word, [c for c in candidates if c != word])
    return f" Did you mean {close!r}?" if close else ""


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
