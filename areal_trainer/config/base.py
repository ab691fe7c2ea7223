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
import warnings
from collections.abc import Iterator

from ..errors import ConfigError, is_number, one_of, suggest

__all__ = ["Checked", "ConfigError", "at_least_one", "deferred_validation", "fraction", "is_number", "one_of", "suggest"]

_DEFER = [False]


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


def at_least_one(key: str, value, *, nullable: bool = False) -> list[str]:
    """A problem unless ``value`` is an integer >= 1 (or None, when ``nullable``)."""
    if value is None and nullable:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return [f"{key}: got {value!r}; must be >= 1{' or null' if nullable else ''}."]
    return []


def fraction(key: str, value) -> list[str]:
    """A problem unless ``value`` is a number in [0, 1]."""
    if not is_number(value) or not 0 <= value <= 1:
        return [f"{key}: got {value!r}; must be in [0, 1]."]
    return []
