"""Metric values carry their own reduction: combined over processes (and micro-batches) by their type,
never by their name."""

import pytest

from areal_trainer.metrics import Max, Mean, Min, Sum, floats, reduce


def test_each_type_combines_its_own_way():
    # Two processes: 30 tokens with a mean of 0.1 and 10 with 0.5 -> 0.2 token-weighted (not the plain 0.3);
    # rows add up; the largest staleness and the smallest ratio are the extremes.
    ranks = [{"actor/clip_frac": Mean(0.1, 30), "rollout/rows": Sum(16), "x/max": Max(2), "x/min": Min(0.9),
              "update/grad_norm": Mean(1.5)},
             {"actor/clip_frac": Mean(0.5, 10), "rollout/rows": Sum(16), "x/max": Max(3), "x/min": Min(0.7),
              "update/grad_norm": Mean(1.5)}]
    out = floats(reduce(ranks))
    assert out == pytest.approx({"actor/clip_frac": 0.2, "rollout/rows": 32, "x/max": 3, "x/min": 0.7,
                                 "update/grad_norm": 1.5})


def test_a_key_some_records_lack_is_combined_over_the_others_and_one_value_stays_exact():
    out = reduce([{"a": Mean(0.1, 3)}, {"a": Mean(0.3, 1), "b": Sum(2)}])
    assert floats(out) == pytest.approx({"a": 0.15, "b": 2})
    value = 0.1 + 0.2  # a mean over one record is that record's value, bit for bit (no v * w / w)
    assert reduce([{"a": Mean(value, 7)}])["a"].value == value


def test_plain_numbers_count_as_means_and_mixed_types_are_an_error():
    assert floats(reduce([{"a": 1.0}, {"a": 3.0}])) == {"a": 2.0}
    assert floats(reduce([{"a": Mean(1.0, 0)}, {"a": Mean(3.0, 0)}])) == {"a": 0.0}  # no weight at all
    with pytest.raises(TypeError, match="'a' was created as"):
        reduce([{"a": Sum(1)}, {"a": Mean(1)}])
