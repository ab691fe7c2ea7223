"""Agents under asynchronous training: episodes of several calls, with tool pauses, span weight updates,
every token keeps the version that sampled it, and no trained token is more than eta versions old."""

from __future__ import annotations

import asyncio
import random
import types

from hypothesis import given, settings
from hypothesis import strategies as st

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.data.loader import PromptLoader
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.rollout.agents.spec import load_agent
from areal_trainer.rollout.agents.workflow import AgentWorkflow
from areal_trainer.rollout.staleness import StalenessManager
from areal_trainer.train.sources.concurrent import AsyncSource

from .test_async_source import FakeEngine, _check_bound, train

TOK = build_tokenizer()


async def pausing_agent(data, *, client, calls=2, pause=0.004):
    """``calls`` calls with a random tool pause after each; the episode's reward is its index's parity."""
    rng = random.Random(data["id"])
    messages = list(data["messages"])
    for _ in range(calls):
        r = await client.chat.completions.create(model="m", messages=messages)
        await asyncio.sleep(rng.random() * pause)
        messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                     {"role": "user", "content": "more"}]
    return float(data["id"] % 2)


def _samples(n):
    return [{"messages": [{"role": "user", "content": f"Tom has {i} apples."}], "prompt": "p", "answer": "1",
             "fields": {"id": i}} for i in range(n)]


def agent_source(eta, batch, calls, rng, export):
    engine = FakeEngine(rng)
    spec = load_agent("tests.train.test_agent_staleness.pausing_agent", {"calls": calls})
    workflow = AgentWorkflow(engine=engine, tokenizer=TOK, reward=types.SimpleNamespace(), agent=spec, export=export)
    loader = PromptLoader(_samples(200), batch, shuffle=False, drop_last=True, seed=0, mode="local")
    staleness = StalenessManager(max_head_offpolicyness=eta, consumer_bs=batch, max_concurrent=batch,
                                 count_rejected=False)
    return AsyncSource(loader=loader, workflow=workflow, engine=engine, gconfig=GenerationHyperparameters(n_samples=2),
                       batch_size=batch, accept=None, dynamic_bs=False, max_rounds=8, staleness=staleness,
                       queue_size=16 * batch, request_timeout=30.0)


@settings(max_examples=8, deadline=None)
@given(eta=st.integers(1, 2), batch=st.integers(1, 2), calls=st.integers(1, 3), seed=st.integers(0, 10**6),
       export=st.sampled_from(["individual", "concat"]))
def test_agent_episodes_keep_the_staleness_bound(eta, batch, calls, seed, export):
    rng = random.Random(seed)
    batches = train(agent_source(eta, batch, calls, rng, export), 6, rng)
    _check_bound(batches, eta)
    for _, b in batches:
        assert len(b.groups) == batch
        for g in b.groups:
            assert len(g.episode_rows) == 2  # the group's two episodes, however many rows each
            assert g.n_rows == sum(g.episode_rows)
