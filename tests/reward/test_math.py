"""Answer extraction and the GSM8K reward: the exact-number fast path, the math-verify fallback
(cases of the reference's math-verify tests), and an answer that hangs math-verify, killed by the
reward pool's deadline."""

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_trainer.reward import math as reward_math
from areal_trainer.reward.functions import RewardFunction
from areal_trainer.reward.math import extract_answer, gsm8k_reward_fn, last_boxed, numeric_values, to_number
from areal_trainer.reward.service import FunctionReward, RewardService

from ..helpers import HANG, within


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


# The reference's math-verify cases (gold given without ####, as in its tests).
@pytest.mark.parametrize("completion,gold,expected", [
    ("The answer is 4", "4", 1.0),
    ("The answer is 0.5", "1/2", 1.0),
    ("\\boxed{4}", "4", 1.0),
    ("The answer is 5", "4", 0.0),
    ("", "4", 0.0),
    ("   \n", "4", 0.0),
    ("$\\sqrt{4} = 2$", "2", 1.0),
    ("Let me think.\nFirst, 6 * 7 = 42.\nSo the total is 42.\nFinal answer: 42", "42", 1.0),
])
def test_reference_cases(completion, gold, expected):
    assert gsm8k_reward_fn("q", completion, gold) == expected


# Answers that are not plain numbers: math-verify decides.
@pytest.mark.parametrize("completion,gold,expected", [
    ("\\boxed{\\sqrt{4}}", "#### 2", 1.0),
    ("The answer is $\\frac{1}{2}$.", "#### 0.5", 1.0),   # the last-number guess (2) would be wrong
    ("\\boxed{\\dfrac{1}{2}}", "#### 0.5", 1.0),
    ("\\boxed{2\\sqrt{2}}", "#### \\sqrt{8}", 1.0),
    ("\\boxed{12 \\text{ apples}}", "#### 12", 1.0),
    ("\\boxed{x^{2}}", "#### 2", 0.0),
    ("\\boxed{\\frac{1}{0}}", "#### 2", 0.0),
    ("\\boxed{}", "#### 2", 0.0),
    ("We have $3 \\times 4 = 12$. So the answer is 13.", "#### 12", 0.0),
])
def test_symbolic_fallback(completion, gold, expected):
    assert gsm8k_reward_fn("q", completion, gold) == expected


@pytest.mark.parametrize("completion,gold,expected", [
    ("50\\%", "#### 0.5", 1.0),
    ("\\boxed{50\\%}", "#### 50", 1.0),
    ("The discount is 50%.", "#### 1/2", 1.0),
    ("0.5", "#### 50%", 1.0),
    ("\\boxed{40\\%}", "#### 0.5", 0.0),
    ("\\boxed{\\$1{,}200}", "#### 1200", 1.0),
])
def test_percent_and_latex_number_forms(completion, gold, expected):
    assert gsm8k_reward_fn("q", completion, gold) == expected


@pytest.mark.parametrize("completion", [
    "\\boxed{\\frac{", "$$$$", "\\sqrt{", "\\boxed{\\left(}", "}}}{{{\\", "\\frac{1}{2", "\\boxed{1/0}",
    "\\begin{matrix} 1 & 2 \\end{matrix}", "\\boxed{\\int_0^\\infty}", "1e999999", "\\boxed{" + "(" * 100 + "}",
])
def test_malformed_answers_score_zero_without_raising(completion):
    assert gsm8k_reward_fn("q", completion, "#### 3") == 0.0


def _not_called(gold, prediction):
    raise AssertionError("math-verify must not run for plain numbers")


def test_plain_numbers_never_call_math_verify(monkeypatch):
    monkeypatch.setattr(reward_math, "equivalent", _not_called)
    assert gsm8k_reward_fn("q", "so 3 + 4 = 7\n#### 7", "#### 7") == 1.0
    assert gsm8k_reward_fn("q", "\\boxed{8}", "#### 7") == 0.0
    assert gsm8k_reward_fn("q", "no digits here", "#### 7") == 0.0


def test_an_answer_that_hangs_math_verify_is_killed_by_the_pool_and_counted():
    """A 370-million-digit power: one C call that never returns to Python. The reward's worker is killed
    at the deadline, the sample scores the timeout value and is counted, and the next call works."""
    fn = RewardFunction.bind("areal_trainer.reward.math.gsm8k_reward_fn", kwargs={}, key="reward.fn")
    service = RewardService([FunctionReward(fn, workers=1, timeout=3.0)], timeout_value=-1.0)
    try:
        rows = [{"prompt": "q", "answer": "#### 3"}, {"prompt": "q", "answer": "#### 3"}]
        scores = within(HANG, service.score_completions, rows, ["\\boxed{9^{9^{9}}}", "\\boxed{\\sqrt{9}}"])
        assert scores.rewards == [-1.0, 1.0] and scores.timeouts == [1, 0]
        assert service.score_completions(rows[:1], ["#### 3"]).rewards == [1.0]  # a fresh worker took over
    finally:
        service.close()


def test_math_verify_works_off_the_main_thread():
    # math-verify's own signal-based timeouts would raise in a worker thread; they are off here.
    out = []
    th = threading.Thread(target=lambda: out.append(gsm8k_reward_fn("q", "\\boxed{\\sqrt{9}}", "#### 3")))
    th.start()
    th.join(60)
    assert out == [1.0]


def test_a_failing_math_verify_is_a_wrong_answer(monkeypatch):
    import math_verify

    monkeypatch.setattr(math_verify, "verify", lambda *a, **k: 1 / 0)
    assert gsm8k_reward_fn("q", "\\boxed{\\sqrt{4}}", "#### 2") == 0.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(list("0123456789.,/-%$\\{}()^_ =abx\n") + ["\\boxed{", "\\frac", "####"]),
                max_size=30).map("".join),
       st.integers(-50, 50))
def test_reward_is_binary_and_never_raises(completion, gold):
    assert gsm8k_reward_fn("q", completion, f"#### {gold}") in (0.0, 1.0)


def test_last_boxed_nested():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("none") is None


def test_extract_and_parse():
    assert extract_answer("x = 3, y = 5") == "5"
    assert extract_answer("it went up by 25%.") == "25%"
    assert to_number("$12.") == 12 and to_number("-3.5") == -3.5 and to_number("abc") is None
    assert numeric_values("50\\%") == {50, to_number("1/2")}
    assert numeric_values("\\sqrt{4}") == frozenset()
