"""Answer extraction and the GSM8K reward: the exact-number fast path, the math-verify fallback
(cases of the reference's math-verify tests), and the deadline around math-verify."""

import logging
import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_trainer.plugins import resolve
from areal_trainer.reward import verify
from areal_trainer.reward.math import extract_answer, gsm8k_reward_fn, last_boxed, numeric_values, to_number
from areal_trainer.reward.runner import RewardRunner


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


def _slow_verifier(gold, prediction):
    """Stands in for math-verify in the worker process: far slower than any test deadline."""
    time.sleep(60)
    return True


def _crashing_verifier(gold, prediction):
    os._exit(3)


def _raising_verifier(gold, prediction):
    raise ValueError("cannot parse")


def _not_called(gold, prediction):
    raise AssertionError("math-verify must not run for plain numbers")


def test_plain_numbers_never_call_math_verify(monkeypatch):
    monkeypatch.setattr(verify, "equivalent", _not_called)
    before = verify.stats()
    assert gsm8k_reward_fn("q", "so 3 + 4 = 7\n#### 7", "#### 7") == 1.0
    assert gsm8k_reward_fn("q", "\\boxed{8}", "#### 7") == 0.0
    assert gsm8k_reward_fn("q", "no digits here", "#### 7") == 0.0
    assert verify.stats() == before


def test_timeout_scores_zero_counts_and_warns(monkeypatch, caplog):
    assert gsm8k_reward_fn("q", "\\boxed{\\sqrt{4}}", "#### 2") == 1.0  # the worker is up
    monkeypatch.setattr(verify, "equivalent", _slow_verifier)
    before = verify.timeouts()
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=verify.__name__):
        reward = gsm8k_reward_fn("q", "\\boxed{\\sqrt{4}}", "#### 2", timeout=0.5)
    elapsed = time.monotonic() - t0
    assert reward == 0.0
    assert elapsed < 10.0
    assert verify.timeouts() == before + 1
    if before == 0:  # the first timeout of the process is always logged
        assert any("timed out" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert gsm8k_reward_fn("q", "\\boxed{\\sqrt{4}}", "#### 2") == 1.0  # a fresh worker took over


def test_timeout_kwarg_passes_through_the_reward_runner(monkeypatch):
    monkeypatch.setattr(verify, "equivalent", _slow_verifier)
    fn = resolve("areal_trainer.reward.math.gsm8k_reward_fn", "reward.fn", {"timeout": 0.5}, n_positional=3)
    runner = RewardRunner(fn, name="gsm8k", kwargs={"timeout": 0.5}, error_value=0.0, max_error_fraction=0.5)
    before = verify.timeouts()
    scores = runner(["q", "q"], ["\\boxed{\\sqrt{4}}", "#### 2"], ["#### 2", "#### 2"])
    assert scores.rewards == [0.0, 1.0] and scores.errors == [0, 0]
    assert scores.timeouts == [1, 0]  # counted on the sample that timed out
    assert scores.stats() == {"reward_errors": 0.0, "verify_timeouts": 1.0}
    assert verify.timeouts() == before + 1


def test_gil_holding_answer_times_out():
    # A 370-million-digit power: one C call that a thread-based deadline could not interrupt.
    before = verify.timeouts()
    t0 = time.monotonic()
    assert gsm8k_reward_fn("q", "\\boxed{9^{9^{9}}}", "#### 3", timeout=1.0) == 0.0
    assert time.monotonic() - t0 < 30  # the worker is killed at the deadline
    assert verify.timeouts() == before + 1


def test_bad_timeout_is_rejected():
    with pytest.raises(ValueError, match="timeout"):
        gsm8k_reward_fn("q", "\\boxed{\\sqrt{4}}", "#### 2", timeout=0)


def test_math_verify_works_off_the_main_thread():
    # math-verify's own signal-based timeouts would raise in a worker thread.
    out = []
    th = threading.Thread(target=lambda: out.append(gsm8k_reward_fn("q", "\\boxed{\\sqrt{9}}", "#### 3")))
    th.start()
    th.join(60)
    assert out == [1.0]


def test_worker_errors_and_crashes_score_zero_and_recover(monkeypatch):
    for bad in (_raising_verifier, _crashing_verifier):
        monkeypatch.setattr(verify, "equivalent", bad)
        before = verify.stats()["errors"]
        assert gsm8k_reward_fn("q", "\\boxed{\\sqrt{4}}", "#### 2") == 0.0
        assert verify.stats()["errors"] == before + 1
    monkeypatch.undo()
    assert gsm8k_reward_fn("q", "\\boxed{\\sqrt{4}}", "#### 2") == 1.0


def test_worker_process_runs_kills_and_restarts():
    worker = verify.WorkerProcess()
    try:
        assert worker.run(divmod, 7, 2, timeout=60) == (3, 1)
        pid = worker.pid
        with pytest.raises(TimeoutError):
            worker.run(time.sleep, 30, timeout=0.2)
        assert worker.pid is None and worker.restarts == 1
        with pytest.raises(verify.WorkerError, match="ZeroDivisionError"):
            worker.run(divmod, 1, 0, timeout=60)
        assert worker.pid not in (None, pid)
    finally:
        worker.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(list("0123456789.,/-%$\\{}()^_ =abx\n") + ["\\boxed{", "\\frac", "####"]),
                max_size=30).map("".join),
       st.integers(-50, 50))
def test_reward_is_binary_and_never_raises(completion, gold):
    assert gsm8k_reward_fn("q", completion, f"#### {gold}", timeout=2.0) in (0.0, 1.0)


def test_last_boxed_nested():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("none") is None


def test_extract_and_parse():
    assert extract_answer("x = 3, y = 5") == "5"
    assert extract_answer("it went up by 25%.") == "25%"
    assert to_number("$12.") == 12 and to_number("-3.5") == -3.5 and to_number("abc") is None
    assert numeric_values("50\\%") == {50, to_number("1/2")}
    assert numeric_values("\\sqrt{4}") == frozenset()
