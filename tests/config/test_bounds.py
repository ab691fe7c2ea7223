"""The one wording of a bound (``errors.number_in``, and ``errors.integer_at_least`` for counts), used by every
rule of the configuration and its binding."""

import ast
import re
from pathlib import Path

import pytest

from areal_trainer.errors import integer_at_least, number_in


@pytest.mark.parametrize("value", [0, 3, 10**9])
def test_integers_at_the_bound_or_above_pass(value):
    assert integer_at_least("k", value, 0) == []


@pytest.mark.parametrize("value", [-1, 1.0, "2", True, None, [1]])
def test_anything_else_is_one_problem_naming_key_and_value(value):
    assert integer_at_least("a.b", value, 0) == [f"a.b: got {value!r}; must be an integer >= 0."]


def test_null_and_a_note():
    assert integer_at_least("k", None, 1, nullable=True) == []
    assert integer_at_least("k", 0, 1, nullable=True) == ["k: got 0; must be >= 1 or null."]
    assert integer_at_least("k", -2, 0, note="0 turns it off") == ["k: got -2; must be an integer >= 0 "
                                                                   "(0 turns it off)."]


# -- every bound: errors.number_in ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,value,message", [
    (dict(low=0, open_low=True, unit="seconds"), 0, "k: got 0; must be > 0 seconds."),
    (dict(low=0, open_low=True, unit="seconds", nullable=True, note="null: no limit"), -1.5,
     "k: got -1.5; must be > 0 seconds or null (null: no limit)."),
    (dict(low=0, finite=True), float("inf"), "k: got inf; must be a finite number >= 0."),
    (dict(low=0, finite=True), float("nan"), "k: got nan; must be a finite number >= 0."),
    (dict(low=0, high=1, open_low=True), 0.0, "k: got 0.0; must be in (0, 1]."),
    (dict(low=0, high=1, open_high=True), 1, "k: got 1; must be in [0, 1)."),
    (dict(low=0, high=4, high_label="max_new_tokens=4"), 5, "k: got 5; must be in [0, max_new_tokens=4]."),
    (dict(high=2), 3, "k: got 3; must be <= 2."),
    (dict(low=0), "1", "k: got '1'; must be >= 0."),
    (dict(low=0), True, "k: got True; must be >= 0."),
    (dict(low=0), None, "k: got None; must be >= 0."),
])
def test_a_value_outside_its_bounds_is_one_problem_naming_key_value_and_range(kwargs, value, message):
    assert number_in("k", value, **kwargs) == [message]


@pytest.mark.parametrize("kwargs,value", [
    (dict(low=0, open_low=True), 1e-9), (dict(low=0), 0), (dict(low=0, high=1), 1.0), (dict(low=0, high=1), 0),
    (dict(low=0, nullable=True), None), (dict(low=0, open_low=True), float("inf")), (dict(high=2), -5),
])
def test_a_value_inside_its_bounds_passes(kwargs, value):
    assert number_in("k", value, **kwargs) == []


BOUND = re.compile(r"must be (an integer |a finite number |a number )?(>|>=|<|<=|in [\[(])")
PACKAGE = Path(__file__).resolve().parents[2] / "areal_trainer"


def _rules() -> list[tuple[str, ast.FunctionDef]]:
    """Every rule function of the configuration and its binding: each section's ``check`` and every ``*_problems``
    (the maths' rules too, which the binding calls)."""
    found = []
    for unit in ("config", "components", "loss", "advantage"):
        for path in sorted((PACKAGE / unit).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and (node.name in ("check", "warnings")
                                                          or node.name.endswith("problems")):
                    found.append((f"{path.relative_to(PACKAGE)}::{node.name}", node))
    return found


def test_no_rule_words_a_bound_itself():
    """A rule that words "must be >= ..." itself drifts from the others; it calls errors.number_in (or
    integer_at_least) instead."""
    assert len(_rules()) > 20  # the scan sees the rules
    bad = sorted({name for name, fn in _rules() for node in ast.walk(fn)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and BOUND.search(node.value)})
    assert not bad, f"{bad} word a bound themselves; use errors.number_in"
