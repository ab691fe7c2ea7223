"""One agent, two forms, one result: the same ``openai``-package agent run with the trainer's client and
over the HTTP endpoint with its own ``openai.AsyncOpenAI`` gives, from the same seed, the same rows (prompt
ids, sampled ids, log-probs, loss masks, versions, rewards) and the same counters, call after call, also
though its requests reach the engine at different times (random waits, a tool in a worker thread, the
sockets). Each generation call waits for every episode in flight (``rollout.agent_batching=episodes``),
so the calls hold the same requests in the same order in both forms."""

import importlib.util
import types

import pytest
import torch

from areal_trainer.config.schema import GenerationHyperparameters, SFTWarmupConfig
from areal_trainer.data import arith
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.agents.spec import load_agent
from areal_trainer.rollout.agents.workflow import AgentWorkflow
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.train.sft import sft_warmup, with_tool_demonstrations

CPU = torch.device("cpu")
MODEL = "builtin:tiny-tools"
REWARD = types.SimpleNamespace()  # agents score through the failure policy (its defaults here)
G = GenerationHyperparameters(n_samples=4, max_new_tokens=40, max_tokens=400)


def _samples(split: str, n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": r["question"]}], "prompt": r["question"],
             "answer": r["answer"], "fields": {"demonstration": r["demonstration"]}} for r in arith.generate(split, n)]


class Recording:
    """The engine, keeping the size of every generation call."""

    def __init__(self, engine):
        self.engine, self.sizes = engine, []
        self.max_positions = engine.max_positions

    def generate(self, prompts, gconfig):
        self.sizes.append(len(prompts))
        return self.engine.generate(prompts, gconfig)


@pytest.fixture(scope="module")
def engine():
    """The tool-calling built-in model after a short warm start on the calculator conversations, so that
    its episodes call the tool, read the result and answer (multi-call episodes, some malformed calls)."""
    tok = build_tokenizer(MODEL)
    model = build_model(MODEL, tok, seed=0)
    sft_warmup(model, tok, with_tool_demonstrations(_samples("train", 256)),
               SFTWarmupConfig(lr=6e-3, batch_size=16, warmup_steps=5), steps=100, seed=0, device=CPU,
               progress=False)
    return Recording(HFEngine(model.eval(), tok, device=CPU)), tok


def _rollouts(engine, tok, agent: str, batching: str, calls: int = 2, kwargs: dict | None = None, g=G,
              processes: int = 0):
    """``calls`` rollout calls of 3 prompts from seed 5; the groups of each and the engine's call sizes."""
    rec, _ = engine
    wf = AgentWorkflow(engine=rec, tokenizer=tok, reward=REWARD, agent=load_agent(agent, kwargs or {}),
                       export="concat", batching=batching, processes=processes)
    torch.manual_seed(5)
    rec.sizes = []
    try:
        out = [wf.rollout(_samples("test", 3), g) for _ in range(calls)]
    finally:
        wf.close()
    return out, list(rec.sizes)


def _same_groups(a, b):
    assert len(a) == len(b)
    for ga, gb in zip(a, b):
        assert sorted(ga.tensors) == sorted(gb.tensors)
        for k in ga.tensors:
            assert torch.equal(ga.tensors[k], gb.tensors[k]), k
        assert ga.episode_rows == gb.episode_rows and ga.episode_rewards == gb.episode_rewards
        assert {k: v.value for k, v in ga.stats.items()} == {k: v.value for k, v in gb.stats.items()}


def test_the_http_and_in_process_forms_give_the_same_rows_call_after_call(engine):
    tok = engine[1]
    local, local_sizes = _rollouts(engine, tok, "tests.agents.two_forms.run_client", "episodes")
    http, http_sizes = _rollouts(engine, tok, "tests.agents.two_forms.HTTP", "episodes")
    assert local_sizes == http_sizes
    for a, b in zip(local, http):
        _same_groups(a, b)
    # The episodes did what the comparison needs: calls the model answered with tool calls, read by the
    # parser and run by the agent itself, and later calls that saw the tool's result.
    stats = [g.stats for call in local for g in call]
    assert sum(s["agent/calls"].value for s in stats) > sum(s["agent/episodes"].value for s in stats)
    assert sum(s["agent/tool_calls"].value for s in stats) > 0


def test_the_http_form_in_agent_processes_gives_the_same_rows_as_in_process(engine):
    """``rollout.agent_processes=2``: the ``openai`` agent's episodes in two processes of their own, against the
    in-process form: the same rows and counters call after call (the process counts no restart)."""
    tok = engine[1]
    local, local_sizes = _rollouts(engine, tok, "tests.agents.two_forms.run_client", "episodes")
    procs, procs_sizes = _rollouts(engine, tok, "tests.agents.two_forms.HTTP", "episodes", processes=2)
    assert local_sizes == procs_sizes
    for a, b in zip(local, procs):
        assert b[0].stats.pop("agent/process_restarts").value == 0
        _same_groups(a, b)
    stats = [g.stats for call in procs for g in call]
    assert sum(s["agent/tool_calls"].value for s in stats) > 0 and sum(s["agent/errors"].value for s in stats) == 0


def test_the_example_agent_posting_json_without_the_package_gives_the_same_rows(engine):
    """The calculator example's ``JSONAgent`` (its requests posted as JSON with aiohttp, no ``openai`` package)
    against its in-process form: the same rows call after call, so that ``scripts/bench_agents.py`` compares
    like with like."""
    tok = engine[1]
    agent = "examples.agents.calculator.openai_agent."
    local, local_sizes = _rollouts(engine, tok, agent + "run", "episodes")
    raw, raw_sizes = _rollouts(engine, tok, agent + "JSONAgent", "episodes")
    assert local_sizes == raw_sizes
    for a, b in zip(local, raw):
        _same_groups(a, b)
    stats = [g.stats for call in raw for g in call]
    assert sum(s["agent/tool_calls"].value for s in stats) > 0 and sum(s["agent/errors"].value for s in stats) == 0


def test_each_generation_call_holds_every_episode_in_flight(engine):
    """12 episodes: the first call samples all 12 first requests; later calls all the episodes still going."""
    tok = engine[1]
    (groups,), sizes = _rollouts(engine, tok, "tests.agents.two_forms.HTTP", "episodes", calls=1)
    assert sizes[0] == 12 and sizes == sorted(sizes, reverse=True)
    assert sum(sizes) == sum(g.stats["agent/calls"].value for g in groups)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct, a pretrained model with its own tokenizer and chat template (``actor.path=smollm2``)."""
    from areal_trainer.model import smollm2 as package
    from areal_trainer.model.load import load_causal_lm, load_tokenizer

    if not package.is_converted(package.checkpoint_dir()) and not all(
            importlib.util.find_spec(m) for m in (package.PACKAGE, "gguf")):
        pytest.skip(f"needs the SmolLM2 package: {package.INSTALL}")

    tok = load_tokenizer("smollm2")
    model = load_causal_lm("smollm2", tokenizer=tok, dtype="float32", device=CPU, seed=0)
    return Recording(HFEngine(model.eval(), tok, device=CPU)), tok


def test_the_two_forms_give_the_same_rows_on_a_pretrained_model(smollm2):
    tok = smollm2[1]
    g = GenerationHyperparameters(n_samples=2, max_new_tokens=24, max_tokens=512)
    local, local_sizes = _rollouts(smollm2, tok, "tests.agents.two_forms.run_client", "episodes", calls=1,
                                   kwargs={"task": "try_again"}, g=g)
    http, http_sizes = _rollouts(smollm2, tok, "tests.agents.two_forms.HTTP", "episodes", calls=1,
                                 kwargs={"task": "try_again"}, g=g)
    assert local_sizes == http_sizes and local_sizes[0] == 6
    for a, b in zip(local, http):
        _same_groups(a, b)


def test_the_example_agents_client_sends_through_aiohttp_and_says_so_when_it_cannot(monkeypatch):
    """httpx, the ``openai`` package's default transport, costs about 10 ms a request with 64 episodes in
    flight (docs/agents_http.md), so the example's client uses aiohttp; without the extra it warns and works."""
    import openai

    from examples.agents.calculator import openai_agent

    aio = openai.DefaultAioHttpClient
    client = openai_agent.async_client("http://127.0.0.1:9/v1", "sk-test")
    assert isinstance(client._client, aio) and client.max_retries == 0
    assert not isinstance(openai_agent.async_client("http://127.0.0.1:9/v1", "sk-test", aiohttp=False)._client, aio)

    class Missing:
        def __init__(self, **_):
            raise RuntimeError("To use the aiohttp client you must have installed the package with the `aiohttp` extra")

    monkeypatch.setattr(openai, "DefaultAioHttpClient", Missing)
    with pytest.warns(UserWarning, match=r'aiohttp.*using httpx.*pip install "openai\[aiohttp\]"'):
        fallback = openai_agent.async_client("http://127.0.0.1:9/v1", "sk-test")
    assert not isinstance(fallback._client, aio) and fallback.max_retries == 0
