"""Answer extraction and the GSM8K reward (cases of the reference's math-verify tests)."""

import pytest

from areal_trainer.reward.math import extract_answer, gsm8k_reward_fn, last_boxed, to_number


@pytest.mark.parametrize("completion,gold,expected", [
    ("The answer is 4", "#### 4", 1.0),
    ("The answer is 0.5", "#### 1/2", 1.0),
    ("so \\boxed{4}", "#### 4", 1.0),
    ("The answer is 5", "#### 4", 0.0),
    ("", "#### 4", 0.0),
    ("Step 1: 3 + 4 = 7\nStep 2: 7 * 6 = 42\nFinal answer: 42", "#### 42", 1.0),
    ("7 + 5 = 12\n#### 12", "7 + 5 = 12\n#### 12", 1.0),
    ("#### 1,000", "#### 1000", 1.0),
    ("\\boxed{\\frac{3}{4}}", "#### 0.75", 1.0),
    ("#### 12 apples and then 13", "#### 12", 1.0),
    ("\\boxed{x^{2", "#### 2", 1.0),  # unclosed box: falls back to the last number
    ("((((", "#### 3", 0.0),
])
def test_gsm8k_reward(completion, gold, expected):
    assert gsm8k_reward_fn("q", completion, gold) == expected


def test_last_boxed_nested():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("none") is None


def test_extract_and_parse():
    assert extract_answer("x = 3, y = 5") == "5"
    assert to_number("$12.") == 12 and to_number("-3.5") == -3.5 and to_number("abc") is None
