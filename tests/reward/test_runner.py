"""A reward function that raises on some samples does not stop training; too many failures do,
with a message naming the function and an example input."""

import pytest

from areal_trainer.errors import UserError
from areal_trainer.reward.runner import RewardRunner


def flaky(prompt, completion, answer, **kwargs):
    if "boom" in completion:
        raise ValueError("cannot parse")
    return 1.0


def test_failures_get_the_error_value_and_are_counted():
    run = RewardRunner(flaky, name="tests.flaky", kwargs={}, error_value=-1.0, max_error_fraction=0.5)
    scores = run(["p"] * 4, ["ok", "boom", "ok", "ok"], ["a"] * 4)
    assert scores.rewards == [1.0, -1.0, 1.0, 1.0] and scores.errors == [0, 1, 0, 0]
    assert scores.stats(0, 2) == {"reward_errors": 1.0, "verify_timeouts": 0.0}
    assert scores.stats(2) == {"reward_errors": 0.0, "verify_timeouts": 0.0}


def test_too_many_failures_stop_with_a_clear_message():
    run = RewardRunner(flaky, name="tests.flaky", kwargs={}, error_value=0.0, max_error_fraction=0.25)
    with pytest.raises(UserError, match=r"reward.fn tests.flaky raised on 2 of 4 samples.*'boom 1'.*ValueError: cannot parse"):
        run(["p"] * 4, ["boom 1", "boom 2", "ok", "ok"], ["a"] * 4)
