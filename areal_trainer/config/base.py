"""Shared machinery of the config schema: problem collection and deferred validation.

Every config dataclass implements ``check(key) -> list[str]``, which returns one message per
problem in its *own* fields (children are checked by the tree walk in ``validate.py``). Each
message starts with the full key, states the bad value and says how to fix it.

Built directly from Python (``NormConfig(mean_level="foo")``) a dataclass raises ``ValueError``
at once, like any constructor. When the loader converts a whole composed config, it defers
these checks so that every problem of the config can be reported together.
"""

from __future__ import annotations

import contextlib
import difflib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

_DEFER = [False]


class ConfigError(ValueError):
    """One or more problems in a configuration; ``problems`` lists them all."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        n = len(self.problems)
        super().__init__(f"{n} configuration problem{'s' if n != 1 else ''}:\n{lines}")


@contextlib.contextmanager
def deferred_validation() -> Iterator[None]:
    """Within this block, config constructors do not raise; call ``validate`` afterwards."""
    old = _DEFER[0]
    _DEFER[0] = True
    try:
        yield
    finally:
        _DEFER[0] = old


class Checked:
    """Mixin: run ``check`` at construction unless validation is deferred."""

    def check(self, key: str) -> list[str]:  # pragma: no cover - overridden
        return []

    def warnings(self, key: str) -> list[str]:
        return []

    def __post_init__(self) -> None:
        if _DEFER[0]:
            return
        problems = self.check(type(self).__name__)
        if problems:
            raise ConfigError(problems)
        for w in self.warnings(type(self).__name__):
            warnings.warn(w, UserWarning, stacklevel=3)


def one_of(key: str, value: Any, choices: Iterable[Any], fix: str = "") -> list[str]:
    """A problem if ``value`` is not among ``choices`` (with a did-you-mean for strings)."""
    choices = list(choices)
    if value in choices:
        return []
    shown = ", ".join("null" if c is None else repr(c) for c in choices)
    hint = suggest(value, [c for c in choices if isinstance(c, str)])
    msg = f"{key}: got {value!r}; must be one of {shown}.{hint}"
    return [msg + (f" {fix}" if fix else "")]


def suggest(word: Any, candidates: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest candidate, or an empty string."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
