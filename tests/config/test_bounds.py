"""The one wording of a count's bound (``errors.integer_at_least``), used by every section that has counts."""

import pytest

from areal_trainer.errors import integer_at_least


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
