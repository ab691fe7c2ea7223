"""The HTTP agent example (``examples/agents/http_agent``): every episode is a process of its own that
talks to the trainer's endpoint with the ``openai`` package. Through the real command line, and its
``run`` directly: a finished episode gives its reward, a failing one raises with its stderr, a
cancelled one is killed."""

import asyncio
import json
import time
import uuid

import openai
import pytest
import torch

from areal_trainer.config.sampling import GenerationHyperparameters
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.agents.endpoint import EndpointServer, LoopHandler
from areal_trainer.rollout.agents.session import EpisodeSession
from areal_trainer.rollout.agents.tool_parsers import get_parser
from areal_trainer.rollout.engines.batcher import GenerationBatcher
from areal_trainer.rollout.engines.hf import HFEngine
from examples.agents.http_agent import agent, episode

from .helpers import HANG, cli, processes_left, processes_with

ARGS = ["--config-name", "grpo", "+scale=tiny", "sft_warmup.steps=2", "total_train_steps=2",
        "rollout.agent=examples.agents.http_agent.agent.run", "valid_dataset.max_rows=4", "evaluator.freq_steps=2"]
ROW = {"question": "Tom has 3 apples. Tom buys 4 more. How many apples does Tom have now?",
       "answer": "3 + 4 = 7\n#### 7",
       "messages": [{"role": "user",
                     "content": "Tom has 3 apples. Tom buys 4 more. How many apples does Tom have now?"}]}


@pytest.mark.parametrize("processes", [0, 2])
def test_the_http_agent_example_trains_from_the_command_line(tmp_path, processes):
    """On the trainer's loop, and in two agent processes (``rollout.agent_processes``), which end with the run."""
    marker = uuid.uuid4().hex
    cli([*ARGS, "trial_name=t", f"rollout.agent_processes={processes}"], cwd=tmp_path,
        env={"AREAL_TEST_MARK": marker})
    with open(tmp_path / "outputs" / "grpo" / "t" / "metrics.jsonl") as f:
        records = {r["step"]: r for r in map(json.loads, f) if "agent/episodes" in r}
    assert sorted(records) == [1, 2]
    for r in records.values():
        assert r["agent/episodes"] == 4 and r["agent/errors"] == 0 and r["agent/timeouts"] == 0
        assert r["agent/episodes"] <= r["agent/calls"] <= 2 * r["agent/episodes"]
        assert r.get("agent/process_restarts") == (0 if processes else None)
    assert records[2]["eval/agent/episodes"] == 4 and records[2]["eval/agent/errors"] == 0
    # The trainer and its server thread are gone, and no episode or agent process outlived them.
    assert processes_left(marker) == []


@pytest.fixture(scope="module")
def endpoint():
    tok = build_tokenizer()
    engine = HFEngine(build_model("builtin:tiny", tok, seed=0).eval(), tok, device=torch.device("cpu"))
    with EndpointServer() as server:
        yield server, tok, engine


async def _episode(endpoint, call):
    """``call(base_url, key)`` in an episode of the endpoint; the session and the result."""
    server, tok, engine = endpoint
    batcher = GenerationBatcher(engine)
    session = EpisodeSession(episode=0, tokenizer=tok, batcher=batcher, parser=get_parser("hermes"),
                             gconfig=GenerationHyperparameters(max_new_tokens=6, max_tokens=128))
    key = server.open_episode(LoopHandler(session, asyncio.get_running_loop()))
    try:
        return session, await call(server.base_url, key)
    finally:
        server.close_episode(key)
        await batcher.close()


def test_an_episode_process_answers_in_one_or_two_calls_and_prints_its_reward(endpoint):
    session, reward = asyncio.run(_episode(endpoint, lambda url, key: agent.run(ROW, base_url=url, api_key=key)))
    tok = endpoint[1]
    assert len(session.records) in (1, 2) and (reward == 1.0 or len(session.records) == 2)
    last = tok.decode(session.records[-1].output_ids, skip_special_tokens=True)
    assert reward == float(episode.final_number(last) == "7")
    if len(session.records) == 2:  # the second call saw the first answer and the feedback
        assert session.records[1].prompt_ids[:len(session.records[0].prompt_ids)] == session.records[0].prompt_ids


def test_a_failing_episode_process_raises_with_its_stderr(endpoint):
    async def wrong_key(url, key):
        return await agent.run(ROW, base_url=url, api_key=key + "-wrong")

    with pytest.raises(RuntimeError, match=r"(?s)episode exited with 1.*AuthenticationError.*Invalid API key"):
        asyncio.run(_episode(endpoint, wrong_key))


def test_an_episode_process_without_a_reward_line_raises(endpoint, monkeypatch):
    monkeypatch.setattr(agent, "EPISODE", "json.tool")  # echoes stdin: exit 0, but no number
    with pytest.raises(RuntimeError, match="printed no reward"):
        asyncio.run(_episode(endpoint, lambda url, key: agent.run(ROW, base_url=url, api_key=key)))


def test_a_cancelled_episode_kills_its_process(endpoint, monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv("AREAL_TEST_MARK", marker)

    async def cancelled(url, key):
        task = asyncio.ensure_future(agent.run(ROW, base_url=url, api_key=key))
        deadline = time.monotonic() + HANG
        while not processes_with(marker):  # cancelled as soon as its process runs, not after a guessed time
            assert not task.done() and time.monotonic() < deadline, "no episode process started"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return processes_with(marker)  # the cancelled episode has waited for its process to end

    _, left = asyncio.run(_episode(endpoint, cancelled))
    assert left == []


def test_the_episode_reads_the_endpoint_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    client = openai.OpenAI(max_retries=0)
    assert str(client.base_url) == "http://127.0.0.1:9/v1/" and client.api_key == "sk-test"


async def _episodes(endpoint, rows: list[dict], call):
    """``call(row, base_url, key)`` for every row at once, each in an episode of its own; the sessions and
    the results (an exception where the call raised)."""
    server, tok, engine = endpoint
    batcher = GenerationBatcher(engine)
    sessions = [EpisodeSession(episode=i, tokenizer=tok, batcher=batcher, parser=get_parser("hermes"),
                               gconfig=GenerationHyperparameters(max_new_tokens=6, max_tokens=128))
                for i in range(len(rows))]
    loop = asyncio.get_running_loop()
    keys = [server.open_episode(LoopHandler(s, loop)) for s in sessions]
    try:
        results = await asyncio.gather(*(call(row, server.base_url, key) for row, key in zip(rows, keys)),
                                       return_exceptions=True)
    finally:
        for key in keys:
            server.close_episode(key)
        await batcher.close()
    return sessions, results


def test_one_episode_server_process_runs_many_episodes_at_once(endpoint, monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv("AREAL_TEST_MARK", marker)
    agent_ = agent.EpisodeServer()

    async def main():
        got = await _episodes(endpoint, [ROW] * 6, lambda row, url, key: agent_.run(row, base_url=url, api_key=key))
        pids = processes_with(marker)
        await agent_.aclose()
        return got, pids

    (sessions, rewards), pids = asyncio.run(main())
    assert len(pids) == 1  # one process served the six episodes
    tok = endpoint[1]
    for session, reward in zip(sessions, rewards):
        assert len(session.records) in (1, 2)
        last = tok.decode(session.records[-1].output_ids, skip_special_tokens=True)
        assert reward == float(episode.final_number(last) == "7")
    assert processes_left(marker) == []  # aclose ended it


def test_the_episode_server_reports_a_failing_episode_and_serves_the_next(endpoint):
    agent_ = agent.EpisodeServer()

    async def main():
        bad = await _episodes(endpoint, [ROW], lambda row, url, key: agent_.run(row, base_url=url, api_key=key + "-x"))
        good = await _episodes(endpoint, [ROW], lambda row, url, key: agent_.run(row, base_url=url, api_key=key))
        await agent_.aclose()
        return bad[1][0], good[1][0]

    bad, good = asyncio.run(main())
    assert isinstance(bad, RuntimeError) and "AuthenticationError" in str(bad) and "Invalid API key" in str(bad)
    assert good in (0.0, 1.0)


def test_a_dead_episode_server_fails_its_episodes_with_its_stderr_and_is_started_again(endpoint, monkeypatch):
    agent_ = agent.EpisodeServer()
    monkeypatch.setattr(agent, "EPISODE", "examples.agents.http_agent.no_such_module")

    async def main():
        dead = await _episodes(endpoint, [ROW, ROW], lambda row, url, key: agent_.run(row, base_url=url, api_key=key))
        monkeypatch.setattr(agent, "EPISODE", "examples.agents.http_agent.episode")
        again = await _episodes(endpoint, [ROW], lambda row, url, key: agent_.run(row, base_url=url, api_key=key))
        await agent_.aclose()
        return dead[1], again[1][0]

    dead, again = asyncio.run(main())
    assert all(isinstance(e, RuntimeError) and "exited with 1" in str(e) and "No module named" in str(e) for e in dead)
    assert again in (0.0, 1.0)


def test_a_cancelled_episode_is_cancelled_in_the_episode_server(endpoint):
    agent_ = agent.EpisodeServer()
    server, tok, engine = endpoint

    async def main():
        hold = asyncio.Event()
        session = EpisodeSession(episode=0, tokenizer=tok, batcher=_Held(GenerationBatcher(engine), hold),
                                 parser=get_parser("hermes"), gconfig=GenerationHyperparameters(max_new_tokens=6))
        key = server.open_episode(LoopHandler(session, asyncio.get_running_loop()))
        task = asyncio.ensure_future(agent_.run(ROW, base_url=server.base_url, api_key=key))
        deadline = time.monotonic() + HANG
        while not session.batcher.waiting:  # the process's request has reached the engine
            assert not task.done() and time.monotonic() < deadline, "no request arrived"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        server.close_episode(key)
        hold.set()
        assert agent_._pending == {}  # nothing waits for the cancelled episode's answer
        proc = agent_._proc
        await agent_.aclose()
        await session.batcher.inner.close()
        return proc.returncode

    assert asyncio.run(main()) == 0  # it exited by itself once its stdin closed


class _Held:
    """A batcher whose generation waits for ``hold``: an episode stays inside its first model call."""

    def __init__(self, inner, hold: asyncio.Event):
        self.inner, self.hold, self.waiting = inner, hold, False

    async def generate(self, *args, **kwargs):
        self.waiting = True
        await self.hold.wait()
        return await self.inner.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_episode_server_trains_from_the_command_line(tmp_path):
    marker = uuid.uuid4().hex
    cli([*ARGS[:-3], "rollout.agent=examples.agents.http_agent.agent.EpisodeServer", "valid_dataset.max_rows=4",
         "evaluator.freq_steps=2", "trial_name=t"], cwd=tmp_path, env={"AREAL_TEST_MARK": marker})
    with open(tmp_path / "outputs" / "grpo" / "t" / "metrics.jsonl") as f:
        records = {r["step"]: r for r in map(json.loads, f) if "agent/episodes" in r}
    assert sorted(records) == [1, 2]
    for r in records.values():
        assert r["agent/episodes"] == 4 and r["agent/errors"] == 0
        assert r["agent/episodes"] <= r["agent/calls"] <= 2 * r["agent/episodes"]
    assert records[2]["eval/agent/episodes"] == 4 and records[2]["eval/agent/errors"] == 0
    assert processes_left(marker) == []  # the trainer closed its episode processes
