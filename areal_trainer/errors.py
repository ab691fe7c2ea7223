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


def integer_at_least(key: str, value: Any, low: int, *, nullable: bool = False, note: str = "") -> list[str]:
    """A problem unless ``value`` is an integer >= ``low`` (or None, when ``nullable``): the one wording of a
    count's bound. ``note``: what a value means, added in parentheses (e.g. ``0 writes no file``)."""
    if (value is None and nullable) or (is_integer(value) and value >= low):
        return []
    kind = "" if low == 1 else "an integer "
    return [f"{key}: got {value!r}; must be {kind}>= {low}{' or null' if nullable else ''}"
            f"{f' ({note})' if note else ''}."]


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
