"""RewardService: weighted sums of sources, None left out, every kind of failure scored and counted
without stopping the batch, and a clear stop when a source fails on too much of a batch."""

import asyncio
import time

import pytest
import torch

from areal_trainer.errors import UserError
from areal_trainer.failures import FailurePolicy
from areal_trainer.reward.functions import RewardFunction, RewardSample
from areal_trainer.reward.service import FunctionReward, RewardService, SourceResult

from ..helpers import HANG, wait_dead, within

P = "tests.plugins."


def source(name, workers=0, timeout=5.0, **kwargs):
    fn = RewardFunction.bind(P + name, kwargs=kwargs, key="reward.fn")
    return FunctionReward(fn, workers=workers, timeout=timeout)


class Fixed:
    """A source with given values (a plain list, as RemoteReward returns)."""

    def __init__(self, name, values):
        self.name, self.values = name, values

    async def score(self, samples):
        return list(self.values)


class Meeting:
    """A source with given values once every source named in ``room`` (a list shared by them) is scoring; after
    60 s without the others it gives up and scores None: the sources ran one after the other."""

    def __init__(self, name, values, room: list):
        self.name, self.values, self.room = name, values, room

    async def score(self, samples):
        self.room.remove(self.name)
        deadline = time.monotonic() + 60
        while self.room and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        return list(self.values) if not self.room else [None] * len(samples)


ROWS = [RewardSample("q", "4", "4", {"tolerance": 0.5}),
        RewardSample("q", "4.3", "4", {"tolerance": 0.5}),
        RewardSample("q", "5", "4", {"tolerance": 0.1})]


def test_weighted_sum_with_none_left_out():
    judge = Fixed("judge", [1.0, None, None])
    with RewardService([source("exact"), source("close_enough"), judge], weights=[0.5, 2.0, -4.0]) as service:
        scores = service.score(ROWS)
    # exact: 1, 0, 0; close_enough: 1, 1, 0; judge: 1, None, None
    assert scores.rewards == [0.5 * 1 + 2.0 * 1 - 4.0 * 1, 2.0 * 1, 0.0]
    assert scores.none == [0, 1, 1] and scores.all_none == [0, 0, 0]
    m = scores.metrics()
    assert m["reward/exact"] == pytest.approx(1 / 3) and m["reward/close_enough"] == pytest.approx(2 / 3)
    assert m["reward/judge"] == 1.0 and m["reward/none"] == 2.0 and m["reward/errors"] == 0.0
    assert scores.stats(1, 3) == {"reward/errors": 0.0, "reward/timeouts": 0.0, "reward/worker_deaths": 0.0,
                                  "reward/nonfinite": 0.0, "reward/out_of_range": 0.0, "reward/none": 2.0,
                                  "reward/all_none": 0.0, "reward/exact": 0.0, "reward/close_enough": 0.5}


def test_a_sample_no_source_applies_to_gets_zero():
    service = RewardService([Fixed("a", [None, 2.0]), Fixed("b", [None, None])], weights=[3.0, 1.0])
    scores = service.score(ROWS[:2])
    assert scores.rewards == [0.0, 6.0] and scores.all_none == [1, 0] and scores.none == [2, 1]
    assert "reward/b" not in scores.metrics()  # no number from it: no mean


def test_trl_batched_and_per_sample_functions_in_worker_processes():
    rows = [RewardSample([{"role": "user", "content": "2+2?"}], [{"role": "assistant", "content": "4"}], "4",
                         {"solution": "4", "tolerance": 0.0}),
            RewardSample([{"role": "user", "content": "2+3?"}], [{"role": "assistant", "content": " 6 "}], "5",
                         {"solution": "5", "tolerance": 1.0})]
    accuracy = source("accuracy", workers=2)
    close = FunctionReward(RewardFunction.bind(P + "close_enough", kwargs={}, key="reward.fn"), workers=1, timeout=5.0)
    assert accuracy.fn.style == "batched" and close.fn.style == "sample"
    with RewardService([accuracy, Fixed("judge", [0.25, 0.5])]) as service:
        scores = service.score(rows)
    assert scores.rewards == [1.25, 0.5] and scores.values["accuracy"] == [1.0, 0.0]
    plain = [RewardSample("q", "4", "4", {"tolerance": 0.0}), RewardSample("q", "6", "5", {"tolerance": 1.0}),
             RewardSample("q", "7", "5", {"tolerance": 1.0})]
    with RewardService([close]) as service:
        assert service.score(plain).rewards == [1.0, 1.0, 0.0]


def test_every_kind_of_bad_behaviour_is_scored_and_counted():
    fn = source("by_completion", workers=2, timeout=1.0)
    completions = ["ok:0.5", "hang", "raise", "nan", "none", "exit", "ok:0.25", "ok:1"]
    samples = [RewardSample("q", c) for c in completions] + [RewardSample("q", "pid")] * 2
    service = RewardService([fn], error_value=-1.0, timeout_value=-2.0, max_error_fraction=0.9)
    scores = within(HANG, service.score, samples)  # the hung call is killed at its deadline
    assert scores.rewards[:8] == [0.5, -2.0, -1.0, -1.0, 0.0, -1.0, 0.25, 1.0]
    m = scores.metrics()
    assert {k: m[k] for k in ("reward/errors", "reward/timeouts", "reward/worker_deaths", "reward/nonfinite",
                              "reward/none", "reward/all_none")} == {
        "reward/errors": 1.0, "reward/timeouts": 1.0, "reward/worker_deaths": 1.0, "reward/nonfinite": 1.0,
        "reward/none": 1.0, "reward/all_none": 1.0}
    assert scores.stats(0, 2) == {**{f"reward/{c}": 0.0 for c in ("errors", "worker_deaths", "nonfinite",
                                                                  "out_of_range", "none", "all_none")},
                                  "reward/timeouts": 1.0, "reward/by_completion": 0.5}
    pids = {int(v) for v in scores.values["by_completion"][8:]} | set(fn.pool.pids)
    assert fn.pool.restarts == 2  # the hung worker was killed, the exited one replaced
    service.close()
    assert fn.pool.pids == [] and all(wait_dead(p) for p in pids)


def test_values_beyond_float32_are_counted_named_once_and_never_reach_the_batch(capsys):
    """1e39 is a finite Python float and infinite in float32, which the trainer's tensors are."""
    samples = [RewardSample("q", c) for c in ("ok:1e39", "ok:0.5", "ok:-1e39", "ok:3e38", "nan", "ok:1")]
    service = RewardService([source("by_completion")], error_value=-1.0, max_error_fraction=0.9)
    scores = service.score(samples)
    assert scores.rewards == [-1.0, 0.5, -1.0, 3e38, -1.0, 1.0]
    assert scores.out_of_range == [1, 0, 1, 0, 0, 0] and scores.nonfinite == [0, 0, 0, 0, 1, 0]
    assert scores.metrics()["reward/out_of_range"] == 2.0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "warning: reward source tests.plugins.by_completion: 1 of 6 samples of this batch returned NaN or infinity "
        "(counted in reward/nonfinite; scored reward.error_value=-1; the run stops above "
        "reward.max_error_fraction=0.9); the first: completion='nan' -> returned nan",
        "warning: reward source tests.plugins.by_completion: 2 of 6 samples of this batch returned a number beyond "
        "float32, infinite in the trainer's tensors (counted in reward/out_of_range; scored reward.error_value=-1; "
        "the run stops above reward.max_error_fraction=0.9); the first: completion='ok:1e39' -> returned 1e+39"]
    service.score(samples)
    assert capsys.readouterr().err == ""  # named once per source and kind
    # each value in range, the weighted sum not: scored error_value, counted once
    twice = RewardService([source("by_completion"), source("by_completion")], error_value=0.0)
    scores = twice.score([RewardSample("q", "ok:3e38"), RewardSample("q", "ok:1")])
    assert scores.rewards == [0.0, 2.0] and scores.out_of_range == [1, 0]
    assert torch.isfinite(torch.tensor(scores.rewards, dtype=torch.float32)).all()


def test_too_many_failures_in_one_batch_stop_the_run_with_an_example():
    samples = [RewardSample("q", c, "a") for c in ("ok", "raise", "nan", "raise")]
    service = RewardService([source("by_completion")], max_error_fraction=0.5)
    with pytest.raises(UserError, match=r"^reward source tests.plugins.by_completion: 3 of 4 samples of one batch "
                                        r"failed \(more than reward.max_error_fraction=0.5\): 2 raised, 0 killed their "
                                        r"worker process, 1 returned NaN or infinity. Example: completion='raise', "
                                        r"answer='a' -> ValueError: cannot parse the completion .*\. Fix the function "
                                        r"\(reward.workers=0 runs it in the trainer, for a debugger\), or raise "
                                        r"reward.max_error_fraction.$"):
        service.score(samples)
    assert service.score(samples[:2]).errors == [0, 1]  # half the batch is not more than half


def test_the_reward_service_follows_the_failure_policy_it_is_given(capsys):
    """The reward kind of the failure policy: its scores, its one-time notice and its stop rule, in its format."""
    policy = FailurePolicy.of(error_value=-3.0, max_error_fraction=0.25)
    service = RewardService([source("by_completion")], failures=policy)
    assert service.failures is policy and service.error_value == -3.0
    samples = [RewardSample("q", c, "a") for c in ("ok:1", "raise", "ok:0.5", "ok:0", "ok:1")]
    assert service.score(samples).rewards == [1.0, -3.0, 0.5, 0.0, 1.0]  # 1 of 5 is not more than a quarter
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        "warning: reward source tests.plugins.by_completion: 1 of 5 samples of this batch raised (counted in "
        "reward/errors; scored reward.error_value=-3; the run stops above reward.max_error_fraction=0.25); the first: "
        "completion='raise' -> ValueError: cannot parse the completion")
    service.score(samples)
    assert capsys.readouterr().err == ""  # named once
    with pytest.raises(UserError, match=r"^reward source tests.plugins.by_completion: 2 of 5 samples of one batch "
                                        r"failed \(more than reward.max_error_fraction=0.25\): 2 raised"):
        service.score([*samples[:4], RewardSample("q", "raise", "a")])
    with pytest.raises(ValueError, match="give either failures or error_value"):
        RewardService([source("by_completion")], failures=policy, error_value=0.0)


def test_timeouts_do_not_count_towards_the_stop_unless_no_sample_got_a_reward():
    class TimesOut:
        name = "slow"

        def __init__(self, ok: int):
            self.ok = ok

        async def score(self, samples):
            n = len(samples) - self.ok
            return SourceResult([None] * n + [1.0] * self.ok, ["timeout"] * n + ["ok"] * self.ok,
                                ["killed"] * n + [""] * self.ok)

    scores = RewardService([TimesOut(ok=1)], timeout_value=-0.5, max_error_fraction=0.0).score(ROWS)
    assert scores.rewards == [-0.5, -0.5, 1.0] and scores.timeouts == [1, 1, 0]
    with pytest.raises(UserError, match=r"^reward source slow: 3 of 3 samples of one batch gave no result: "
                                        r"3 ran past reward.timeout and 0 failed\. .* raise reward.timeout"):
        RewardService([TimesOut(ok=0)], timeout_value=-0.5).score(ROWS)


def test_contract_violations_stop_the_run():
    with pytest.raises(UserError, match=r"reward function tests.plugins.says_text returned '1.0' \(str\)"):
        RewardService([source("says_text")]).score(ROWS)
    with pytest.raises(UserError, match=r"tests.plugins.wrong_length returned 1 values for 3 completions"):
        RewardService([source("wrong_length")]).score(ROWS)
    with pytest.raises(UserError, match=r"reward source bad gave 2 results for 3 samples"):
        RewardService([Fixed("bad", [1.0, 2.0])]).score(ROWS)


def test_sources_run_concurrently_and_score_works_inside_an_event_loop():
    room = ["a", "b"]  # each source scores only once both are scoring
    service = RewardService([Meeting("a", [1.0] * 3, room), Meeting("b", [1.0] * 3, room)])

    async def main():
        return service.score(ROWS)  # synchronous facade called from a coroutine

    assert asyncio.run(main()).rewards == [2.0] * 3


def test_duplicate_source_names_get_distinct_metrics():
    service = RewardService([Fixed("judge", [1.0]), Fixed("judge", [3.0]), Fixed("errors", [5.0])])
    assert service.names == ["judge", "judge_2", "errors_2"]
    m = service.score(ROWS[:1]).metrics()
    assert (m["reward/judge"], m["reward/judge_2"], m["reward/errors_2"], m["reward/errors"]) == (1.0, 3.0, 5.0, 0.0)


def test_async_functions_of_both_forms_in_workers_and_in_process():
    rows = [RewardSample("q", "4", "4"), RewardSample("q", "5", "4")]
    for workers in (0, 1):
        with RewardService([source("async_exact", workers=workers), source("async_batched", workers=workers)],
                           weights=[1.0, 0.5]) as service:
            assert service.score(rows).rewards == [1.5, 0.5]
