"""The asynchronous rollout source against a simulated engine with random timings: no trained token
is ever more than eta versions old (with and without the dynamic filter), groups arrive oldest
first, every prompt is handed out once, the checkpointed position requeues what was not trained,
and failures reach the trainer's thread."""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_trainer.data.loader import PromptLoader
from areal_trainer.errors import UserError
from areal_trainer.metrics import floats
from areal_trainer.rollout.staleness import StalenessManager
from areal_trainer.rollout.types import Generation
from areal_trainer.train.sources.concurrent import AsyncSource, RolloutFailed

from ..groups import make_group


class FakeEngine:
    """Samples ``tokens`` tokens per prompt with random pauses; each token gets the version current
    when it is sampled, as with partial rollouts (an update can land between any two tokens)."""

    def __init__(self, rng: random.Random, tokens: int = 3, pause: float = 0.002):
        self.rng, self.tokens, self.pause = rng, tokens, pause
        self.version = 0
        self.lock = threading.Lock()

    def generate(self, prompts, gconfig):
        out = []
        for _ in prompts:
            versions = []
            for _ in range(self.tokens):
                time.sleep(self.rng.random() * self.pause)
                with self.lock:
                    versions.append(self.version)
            out.append(Generation([7] * self.tokens, [-0.5] * self.tokens, False, versions))
        return out

    def update_weights(self, model, version):
        with self.lock:
            self.version = version


class FakeWorkflow:
    """Two answers per prompt; the reward of prompt i is [1, i % 2] (odd prompts have no variance)."""

    def __init__(self, engine, fail_after: int | None = None):
        self.engine, self.fail_after, self.calls = engine, fail_after, 0

    def rollout(self, samples, gconfig):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("the environment crashed")
        groups = []
        for s in samples:
            gens = self.engine.generate([[1], [1]], gconfig)
            groups.append(make_group([1.0, float(s % 2)], versions=[g.versions for g in gens], answer_len=3))
        return groups


def has_variance(group):
    r = group["rewards"]
    return bool((r != r[0]).any())


def source(eta, batch, *, concurrent=None, dynamic_bs=False, accept=None, rng=None, n_prompts=400,
           queue=None, workflow=None, timeout=30.0):
    rng = rng or random.Random(0)
    engine = FakeEngine(rng)
    loader = PromptLoader(list(range(n_prompts)), batch, shuffle=False, drop_last=True, seed=0, mode="local")
    staleness = StalenessManager(max_head_offpolicyness=eta, consumer_bs=batch,
                                 max_concurrent=concurrent or batch, count_rejected=dynamic_bs)
    return AsyncSource(loader=loader, workflow=workflow or FakeWorkflow(engine), engine=engine, gconfig=None,
                       batch_size=batch, accept=accept, dynamic_bs=dynamic_bs, max_rounds=8, staleness=staleness,
                       queue_size=queue or 16 * batch, request_timeout=timeout)


def train(src, steps, rng, pause=0.01):
    """A trainer: take a batch at version v, 'train', hand over version v + 1; returns the batches."""
    batches = []
    src.start()
    try:
        for v in range(steps):
            batches.append((v, src.next_batch(v)))
            time.sleep(rng.random() * pause)
            src.update_weights(None, v + 1)
    finally:
        src.close()
    return batches


def _check_bound(batches, eta):
    for v, batch in batches:
        for g in batch.groups:
            versions = g["versions"][g["versions"] >= 0]
            assert int(versions.max()) <= v, "a token from the future"
            assert v - int(versions.min()) <= eta, f"staleness {v - int(versions.min())} > {eta} at version {v}"


@settings(max_examples=12, deadline=None)
@given(eta=st.integers(1, 3), batch=st.integers(1, 3), concurrent=st.integers(1, 6), seed=st.integers(0, 10**6),
       filtered=st.booleans(), dynamic=st.booleans())
def test_no_trained_token_is_staler_than_eta(eta, batch, concurrent, seed, filtered, dynamic):
    rng = random.Random(seed)
    accept = has_variance if filtered else None
    src = source(eta, batch, concurrent=concurrent, dynamic_bs=dynamic and filtered, accept=accept, rng=rng)
    batches = train(src, 8, rng)
    _check_bound(batches, eta)
    if not (dynamic and filtered):
        assert all(len(b.groups) == batch for _, b in batches)


def test_staleness_reaches_eta_when_generation_is_fast_and_groups_come_oldest_first():
    rng = random.Random(1)
    batches = train(source(2, 2, rng=rng), 8, rng, pause=0.05)
    _check_bound(batches, 2)
    ids = [i for _, b in batches for i in b.prompt_ids]
    assert ids == list(range(len(ids)))  # handed out in order, trained in order, none twice
    assert max(v - g.min_version for v, b in batches for g in b.groups) == 2


def test_fixed_batch_skips_rejected_groups_and_counts_them():
    rng = random.Random(2)
    batches = train(source(1, 2, accept=has_variance, rng=rng), 4, rng)
    for _, b in batches:
        assert all(i % 2 == 0 for i in b.prompt_ids)
        assert floats(b.metrics)["rollout/accepted_groups"] == 2 and floats(b.metrics)["rollout/sampled_groups"] >= 2
    assert sum(floats(b.metrics)["rollout/sampled_groups"] for _, b in batches) >= 8


def test_dynamic_bs_trains_on_the_accepted_of_each_batch_of_attempts():
    rng = random.Random(3)
    batches = train(source(1, 4, accept=has_variance, dynamic_bs=True, rng=rng), 4, rng)
    for _, b in batches:
        assert floats(b.metrics)["rollout/sampled_groups"] == 4 and b.prompt_ids == sorted(b.prompt_ids)
        assert len(b.groups) == 2  # prompts 4k .. 4k+3: the even ones have reward variance


def test_state_requeues_what_was_handed_out_but_not_trained():
    rng = random.Random(4)
    src = source(2, 2, rng=rng)
    src.start()
    trained = [i for v in range(3) for i in (src.next_batch(v).prompt_ids, src.update_weights(None, v + 1))[0]]
    deadline = time.monotonic() + 60
    while len(src.state_dict()["loader"]["requeue"]) < 2:  # the thread has run a batch ahead of the trainer
        assert time.monotonic() < deadline, "the rollout thread did not run ahead"
        time.sleep(0.01)
    state = src.state_dict()["loader"]
    src.close()
    assert state["requeue"], "the thread had groups ahead of the trainer"
    handed = sorted(trained + state["requeue"])
    assert handed == list(range(len(handed)))  # nothing lost, nothing twice
    # A resumed source hands out the requeued prompts first, then continues where the thread was.
    resumed = source(2, 2, rng=rng)
    resumed.load_state_dict({"loader": state}, version=3)
    assert resumed.staleness.counts().accepted == 3 * 2  # as if versions 0..2 had consumed their batches
    batch = train(resumed, 1, rng)[0][1]
    assert batch.prompt_ids == state["requeue"][:2]


def test_a_failing_workflow_stops_the_trainer_with_the_cause():
    rng = random.Random(5)
    engine = FakeEngine(rng)
    src = source(1, 2, rng=rng, workflow=FakeWorkflow(engine, fail_after=1))
    src.start()
    try:
        src.next_batch(0)
        src.update_weights(None, 1)
        with pytest.raises(RolloutFailed, match="RuntimeError: the environment crashed"):
            src.next_batch(1)
            src.update_weights(None, 2)
            src.next_batch(2)
    finally:
        src.close()


def test_a_stalled_rollout_stops_the_trainer_saying_where_it_is():
    gate = threading.Event()

    class Hangs(FakeWorkflow):
        def rollout(self, samples, gconfig):
            gate.wait(30)  # a reward function that never returns
            return super().rollout(samples, gconfig)

    rng = random.Random(6)
    src = source(1, 2, rng=rng, workflow=Hangs(FakeEngine(rng)), timeout=0.5)
    src.start()
    try:
        with pytest.raises(RolloutFailed,
                           match=r"(?s)no progress for \d+ s \(rollout.request_timeout=0.5\).*gate.wait"):
            src.next_batch(0)
    finally:
        gate.set()
        src.close()


def test_an_unsatisfiable_filter_fails_clearly():
    rng = random.Random(7)
    src = source(1, 2, accept=lambda g: False, rng=rng)
    src.start()
    try:
        with pytest.raises(UserError, match="rollout.max_sampling_rounds=8"):
            src.next_batch(0)
    finally:
        src.close()


def test_overlap_and_idle_metrics_are_fractions():
    rng = random.Random(8)
    batches = train(source(1, 2, rng=rng), 4, rng, pause=0.05)
    for _, b in batches[1:]:
        m = floats(b.metrics)
        for k in ("rollout/overlap_frac", "rollout/trainer_idle_frac", "rollout/generator_idle_frac"):
            assert 0.0 <= m[k] <= 1.0
        assert m["rollout/overlap_frac"] > 0  # the thread generated while the trainer 'trained'
    assert floats(batches[0][1].metrics)["time/rollout_wait"] > 0  # the first batch had to be generated first
