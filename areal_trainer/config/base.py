"""Shared machinery of the config schema: each section's own rules, and the small helpers that word them.

Every config dataclass implements ``check(key) -> list[str]``, one message per problem in its *own*
fields (children are checked by the walk in ``validate.py``), and may add ``warnings(key)``. Each
message starts with the full key, states the bad value and says how to fix it. Constructing a
dataclass checks nothing: a configuration is validated as a whole, once, so that every problem is
reported together (``validate.validate``, called by ``components.build``).
"""

from __future__ import annotations

from ..errors import ConfigError, integer_at_least, is_integer, is_number, number_in, one_of, suggest

__all__ = ["Checked", "ConfigError", "at_least_one", "fraction", "integer_at_least", "is_integer", "is_number",
           "number_in", "one_of", "suggest"]


class Checked:
    """Mixin of the config sections: the rules of its own fields."""

    imports_torch = False
    """Whether ``check`` runs rules defined with the maths, whose modules import torch: the command line's
    early check (``validate.collect(cfg, light=True)``) leaves such a section to the full check."""

    def check(self, key: str) -> list[str]:  # pragma: no cover - overridden
        return []

    def warnings(self, key: str) -> list[str]:
        return []


def at_least_one(key: str, value, *, nullable: bool = False, note: str = "") -> list[str]:
    """A problem unless ``value`` is an integer >= 1 (or None, when ``nullable``)."""
    return integer_at_least(key, value, 1, nullable=nullable, note=note)


def fraction(key: str, value) -> list[str]:
    """A problem unless ``value`` is a number in [0, 1]."""
    return number_in(key, value, 0, 1)
