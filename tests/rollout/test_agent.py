"""The agent workflow on real and scripted engines: rows hold exactly what the engine returned, a chat
template that rewrites history (Qwen3 drops earlier <think> blocks) makes concat fall back to per-call
rows, episodes run concurrently with their requests batched, and a misbehaving agent is contained."""

import asyncio
import threading
import time
import types

import pytest
import torch

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.errors import UserError
from areal_trainer.failures import FailurePolicy
from areal_trainer.metrics import Sum
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.plugins import PluginError
from areal_trainer.rollout.agents.spec import load_agent
from areal_trainer.rollout.agents.workflow import AgentWorkflow
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.rollout.types import Generation

CPU = torch.device("cpu")
REWARD = types.SimpleNamespace()  # the agent workflow scores through the failure policy, not the reward service
FAILURES = FailurePolicy.of(error_value=-1.0, max_error_fraction=0.5)
# Qwen3's template renders an earlier assistant message without its reasoning: only the text after </think>.
THINK_DROPPING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and '</think>' in m['content'] %}{{ m['content'].split('</think>')[-1].strip() }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
THOUGHT = "<think> 3 + 4</think> 7"  # decodes and re-encodes to the same ids with the tokenizer below


def _samples(n):
    return [{"messages": [{"role": "user", "content": f"Tom has {i} apples. How many apples does Tom have?"}],
             "prompt": "p", "answer": f"#### {i}", "fields": {"id": i}} for i in range(n)]


class Recording:
    """An engine wrapper that keeps every Generation it returned, and each call's size."""

    def __init__(self, engine):
        self.engine, self.returned, self.sizes = engine, [], []
        self.max_positions = getattr(engine, "max_positions", None)

    def generate(self, prompts, gconfig):
        out = self.engine.generate(prompts, gconfig)
        self.returned += [(list(p), g) for p, g in zip(prompts, out)]
        self.sizes.append(len(prompts))
        return out


class Scripted:
    """Answers every prompt with the same text, with made-up distinct log-probs and version 7."""

    max_positions = None

    def __init__(self, tok, text):
        self.ids = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]

    def generate(self, prompts, gconfig):
        return [Generation(list(self.ids), [-0.1 * (k + 1) for k in range(len(self.ids))], False, [7] * len(self.ids))
                for _ in prompts]


def _workflow(engine, tok, agent, **kw):
    spec = load_agent(agent, kw.pop("agent_kwargs", {}))
    return AgentWorkflow(engine=engine, tokenizer=tok, reward=REWARD, agent=spec, failures=FAILURES, **kw)


async def two_turns(data, *, client):
    messages = list(data["messages"])
    for _ in range(2):
        r = await client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=8)  # THOUGHT: 7
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "again"}]
    return 1.0


def _rows_match_engine(groups, returned):
    """Every trained token and its log-prob and version are what the engine returned for it."""
    by_output = {}
    for prompt, g in returned:
        by_output.setdefault(tuple(prompt), []).append(g)
    n_answers = 0
    for group in groups:
        t = group.tensors
        for i in range(group.n_rows):
            n = int(t["attention_mask"][i].sum())
            ids, mask = t["input_ids"][i, :n].tolist(), t["loss_mask"][i, :n].bool()
            # split the row into its answers (runs of loss_mask 1) and find each one's generation
            k = 0
            while k < n:
                if not mask[k]:
                    k += 1
                    continue
                end = k
                while end < n and mask[end]:
                    end += 1
                gens = by_output[tuple(ids[:k])]
                gen = next(g for g in gens if g.output_ids == ids[k:end])
                assert t["logprobs"][i, k:end].tolist() == torch.tensor(gen.logprobs, dtype=torch.float32).tolist()
                assert t["versions"][i, k:end].tolist() == gen.versions
                n_answers += 1
                k = end
    return n_answers


@pytest.mark.parametrize("export", ["individual", "concat"])
def test_rows_hold_the_engines_tokens_logprobs_and_versions_bit_for_bit(tok, export):
    torch.manual_seed(0)
    engine = Recording(HFEngine(build_model("builtin:tiny", tok, seed=0), tok, device=CPU))
    wf = _workflow(engine, tok, "tests.rollout.test_agent.two_turns", export=export)
    groups = wf.rollout(_samples(3), GenerationHyperparameters(n_samples=2, max_new_tokens=6))
    assert len(groups) == 3 and all(g.episode_rows is not None and len(g.episode_rows) == 2 for g in groups)
    assert _rows_match_engine(groups, engine.returned) == len(engine.returned) == 12
    assert engine.sizes == [6, 6]  # every episode's first calls in one batch, then every second call


def test_a_template_that_drops_earlier_reasoning_makes_concat_fall_back_and_trains_the_sampled_ids(tok):
    tok = build_tokenizer()
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = THINK_DROPPING
    engine = Recording(Scripted(tok, THOUGHT))
    wf = _workflow(engine, tok, "tests.rollout.test_agent.two_turns", export="concat")
    [group] = wf.rollout(_samples(1), GenerationHyperparameters(n_samples=1, max_new_tokens=16))
    assert group.stats["agent/concat_fallbacks"].value == 1 and group.n_rows == 2 and group.episode_rows == (2,)
    first_prompt, first = engine.returned[0]
    second_prompt, _ = engine.returned[1]
    assert tok.convert_tokens_to_ids("<think>") not in second_prompt  # the history lost the reasoning
    assert second_prompt[:len(first_prompt) + len(first.output_ids)] != first_prompt + first.output_ids
    assert _rows_match_engine([group], engine.returned) == 2
    rows = [group["input_ids"][i, :int(group["attention_mask"][i].sum())].tolist() for i in range(2)]
    assert rows == [p + g.output_ids for p, g in engine.returned]

    tok.chat_template = THINK_DROPPING.replace("'</think>' in m['content']", "false")  # keeps the history whole
    engine = Recording(Scripted(tok, THOUGHT))
    wf = _workflow(engine, tok, "tests.rollout.test_agent.two_turns", export="concat")
    [group] = wf.rollout(_samples(1), GenerationHyperparameters(n_samples=1, max_new_tokens=16))
    # Still no merge: the built-in template closes a turn with <|im_end|>, the model stopped with <eos>.
    assert group.stats["agent/concat_fallbacks"].value == 1
    tok.chat_template = tok.chat_template.replace("<|im_end|>\n{% endfor %}", "{{ eos_token }}\n{% endfor %}")
    engine = Recording(Scripted(tok, THOUGHT))
    wf = _workflow(engine, tok, "tests.rollout.test_agent.two_turns", export="concat")
    [group] = wf.rollout(_samples(1), GenerationHyperparameters(n_samples=1, max_new_tokens=16))
    assert group.stats["agent/concat_fallbacks"].value == 0 and group.n_rows == 1
    assert group["input_ids"][0].tolist() == engine.returned[1][0] + engine.returned[1][1].output_ids
    assert _rows_match_engine([group], engine.returned) == 2


async def slow(data, *, client, delay=0.3):
    await client.chat.completions.create(model="m", messages=data["messages"], max_tokens=2)
    await asyncio.sleep(delay)
    return 0.0


class Meeting:
    """Episodes that, after their call, each wait in their tool until ``n`` episodes have been in it at once
    (for at most 30 s from the first one's arrival); ``most``: how many were in it together."""

    def __init__(self, n: int):
        self.n, self.inside, self.most, self.deadline = n, 0, 0, None

    async def run(self, data, *, client):
        await client.chat.completions.create(model="m", messages=data["messages"], max_tokens=2)
        loop = asyncio.get_running_loop()
        self.deadline = self.deadline or loop.time() + 30
        self.inside += 1
        self.most = max(self.most, self.inside)
        while self.most < self.n and loop.time() < self.deadline:
            await asyncio.sleep(0.001)
        self.inside -= 1
        return 0.0


def test_episodes_run_concurrently_and_max_concurrent_bounds_them(tok):
    engine = Recording(Scripted(tok, "7"))
    g = GenerationHyperparameters(n_samples=2, max_new_tokens=4)
    wf = _workflow(engine, tok, "tests.rollout.test_agent.Meeting", agent_kwargs={"n": 8})
    wf.rollout(_samples(4), g)
    assert engine.sizes == [8] and wf.instance.most == 8  # all eight episodes were in their tools at once
    engine = Recording(Scripted(tok, "7"))
    wf = _workflow(engine, tok, "tests.rollout.test_agent.slow", agent_kwargs={"delay": 0.05}, max_concurrent=2)
    wf.rollout(_samples(4), g)
    assert max(engine.sizes) <= 2 and sum(engine.sizes) == 8


async def failing(data, *, client):
    r = await client.chat.completions.create(model="m", messages=data["messages"])
    if data["id"] == 0:
        raise RuntimeError("the environment broke")
    return {r.id: 1.0}


async def hanging(data, *, client):
    await client.chat.completions.create(model="m", messages=data["messages"])
    if data["id"] == 0:
        await asyncio.sleep(60)
    return 1.0


def test_an_agent_that_raises_scores_the_error_value_and_is_counted_and_named_once(tok, capsys):
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.failing")
    groups = wf.rollout(_samples(3), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    assert [g["rewards"].tolist() for g in groups] == [[-1.0], [1.0], [1.0]]
    assert [g.stats["agent/errors"].value for g in groups] == [1, 0, 0]
    err = capsys.readouterr().err
    assert err.count("warning: rollout.agent tests.rollout.test_agent.failing: 1 of 3 episodes of this rollout "
                     "raised (counted in agent/errors; scored reward.error_value=-1; the run stops above "
                     "reward.max_error_fraction=0.5); the first:\n") == 1
    assert "RuntimeError: the environment broke" in err
    wf.rollout(_samples(3), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    assert "raised" not in capsys.readouterr().err  # once per run; agent/errors counts the rest


def test_too_many_failing_episodes_stop_the_run_naming_the_agent_and_an_example(tok):
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.failing")
    with pytest.raises(UserError, match=r"(?s)^rollout.agent tests.rollout.test_agent.failing: 1 of 1 episodes of one "
                                        r"rollout failed \(more than reward.max_error_fraction=0.5\): 1 raised. "
                                        r"Example:\n.*RuntimeError: the environment broke\n"
                                        r"Fix the agent, or raise reward.max_error_fraction.$"):
        wf.rollout(_samples(1), GenerationHyperparameters(n_samples=1, max_new_tokens=4))


def test_an_episode_past_the_timeout_is_cancelled_scored_and_counted_without_stopping(tok):
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.hanging", timeout=2.0)
    groups = wf.rollout(_samples(3), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    assert [g["rewards"].tolist() for g in groups] == [[-1.0], [1.0], [1.0]]
    assert [g.stats["agent/timeouts"].value for g in groups] == [1, 0, 0]


def sync_agent(data, *, client, reward=0.25):
    r = client.chat.completions.create(model="m", messages=data["messages"])
    client.set_reward(r.id, reward)
    return {}


class Counter:
    def __init__(self, start: int):
        self.n = start

    async def run(self, data, *, client):
        await client.chat.completions.create(model="m", messages=data["messages"])
        self.n += 1
        return float(self.n)


def test_plain_functions_run_in_a_thread_and_classes_are_built_once_with_the_kwargs(tok):
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.sync_agent", agent_kwargs={"reward": 0.25})
    [g] = wf.rollout(_samples(1), GenerationHyperparameters(n_samples=2, max_new_tokens=4))
    assert g["rewards"].tolist() == [0.25, 0.25]
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.Counter", agent_kwargs={"start": 10})
    [g] = wf.rollout(_samples(1), GenerationHyperparameters(n_samples=2, max_new_tokens=4))
    assert sorted(g["rewards"].tolist()) == [11.0, 12.0] and wf.instance.n == 12


async def no_client(data):
    return 1.0


@pytest.mark.parametrize("path,match", [
    ("tests.rollout.test_agent.nope", "has no attribute 'nope'"),
    ("tests.rollout.test_agent.no_client", "must take data and either client or base_url and api_key"),
    ("tests.rollout.test_agent.REWARD", "it must be an async function run"),
])
def test_an_agent_without_the_contract_is_refused_naming_the_key(path, match):
    with pytest.raises(PluginError, match=match) as e:
        load_agent(path, {})
    assert "rollout.agent" in str(e.value)


def test_agent_kwargs_that_do_not_fit_are_refused():
    with pytest.raises(PluginError, match="rollout.agent_kwargs: colour"):
        load_agent("tests.rollout.test_agent.slow", {"colour": 1})


STUCK = {"in": threading.Event(), "release": threading.Event(), "out": threading.Event()}
"""Where :func:`stuck_sync_agent`'s stuck episode is: stuck, let go, returned."""


def stuck_sync_agent(data, *, client):
    client.chat.completions.create(model="m", messages=data["messages"])
    if data["id"] == 0:  # a thread cannot be cancelled: the episode is abandoned at its timeout
        STUCK["in"].set()
        STUCK["release"].wait(120)
        STUCK["out"].set()
    return 1.0


def test_a_plain_def_agent_past_its_timeout_does_not_hold_up_the_rollout(tok):
    for event in STUCK.values():
        event.clear()
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.stuck_sync_agent", timeout=2.0)
    try:
        groups = wf.rollout(_samples(2), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
        assert STUCK["in"].is_set() and not STUCK["out"].is_set()  # the rollout returned while it was stuck
    finally:
        STUCK["release"].set()
    assert [g["rewards"].tolist() for g in groups] == [[-1.0], [1.0]]
    assert groups[0].stats["agent/timeouts"].value == 1
    assert [g.stats["agent/abandoned"].value for g in groups] == [1, 0]  # its thread is left running


def divide(a: int, b: int) -> float:
    """Divide two numbers.

    Args:
        a: the dividend.
        b: the divisor.
    """
    return a / b


async def tool_user(data, *, client):
    calls = [{"id": "c1", "function": {"name": "divide", "arguments": '{"a": 6, "b": 3}'}},
             {"id": "c2", "function": {"name": "divide", "arguments": '{"a": 1, "b": 0}'}},
             {"id": "c3", "function": {"name": "divide", "arguments": "not json"}},
             {"id": "c4", "function": {"name": "multiply", "arguments": "{}"}}]
    await client.chat.completions.create(model="m", messages=data["messages"], tools=[divide])
    results = [await client.call_tool(c, [divide]) for c in calls]
    assert [r["role"] for r in results] == ["tool"] * 4 and results[0]["content"] == "2.0"
    assert results[1]["content"].startswith("Error: ZeroDivisionError") and "not valid JSON" in results[2]["content"]
    assert "there is no tool 'multiply'" in results[3]["content"]
    return 1.0


def test_a_tool_that_raises_or_is_misused_returns_its_error_to_the_model_and_is_counted(tok):
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.tool_user")
    [g] = wf.rollout(_samples(1), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    assert g["rewards"].tolist() == [1.0] and g.stats["agent/errors"].value == 0
    # The model's answer ("7") holds no tool call; the agent ran four of its own through call_tool.
    assert g.stats["agent/tool_calls"].value == 0 and g.stats["agent/tool_errors"].value == 3


TOOL_GATE = threading.Event()


def slow_tool() -> str:
    """Waits for the test to let it go."""
    TOOL_GATE.wait(60)
    return "late"


async def slow_tool_user(data, *, client):
    await client.chat.completions.create(model="m", messages=data["messages"], tools=[slow_tool])
    result = await client.call_tool({"id": "c1", "function": {"name": "slow_tool", "arguments": "{}"}}, [slow_tool])
    return 1.0 if result["content"] == "Error: tool 'slow_tool' timed out after 0.2 s." else 0.0


def test_a_tool_past_the_policys_limit_is_abandoned_counted_and_named_once(tok, capsys):
    """The tool kind of the failure policy: ``call_tool`` without a timeout gets the policy's; a plain ``def`` tool
    past it is abandoned in its thread (a timeout, not an error), and the first is named once in the policy's
    format."""
    TOOL_GATE.clear()
    policy = FailurePolicy.of(tool_timeout=0.2)
    wf = AgentWorkflow(engine=Scripted(tok, "7"), tokenizer=tok, reward=REWARD, failures=policy,
                       agent=load_agent("tests.rollout.test_agent.slow_tool_user", {}))
    try:
        groups = wf.rollout(_samples(2), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    finally:
        TOOL_GATE.set()
    assert [g["rewards"].tolist() for g in groups] == [[1.0], [1.0]]  # the model read the timeout's text
    assert [(g.stats["agent/tool_timeouts"].value, g.stats["agent/tool_abandoned"].value,
             g.stats["agent/tool_errors"].value) for g in groups] == [(1, 1, 0), (1, 1, 0)]
    err = capsys.readouterr().err.splitlines()
    assert "warning: the tools of rollout.agent tests.rollout.test_agent.slow_tool_user: 2 of 2 tool calls of this " \
           "rollout ran out of time (counted in agent/tool_timeouts; ended after client.call_tool(timeout=...)=0.2 s " \
           "(cancelled or abandoned); the model reads the error text as the result); the first: 'slow_tool' " \
           "abandoned after 0.2 s" in err
    assert sum("could not be stopped (counted in agent/tool_abandoned" in line for line in err) == 1
    wf.rollout(_samples(1), GenerationHyperparameters(n_samples=1, max_new_tokens=4))  # the gate is open now
    assert "tool" not in capsys.readouterr().err


def test_episodes_take_their_limit_and_score_from_the_failure_policy(tok):
    """The agent kind of the failure policy: ``rollout.agent_timeout`` and ``reward.error_value`` as bound, with no
    ``timeout`` of the workflow's own."""
    policy = FailurePolicy.of(error_value=-5.0, agent_timeout=1.0)
    wf = AgentWorkflow(engine=Scripted(tok, "7"), tokenizer=tok, reward=REWARD, failures=policy,
                       agent=load_agent("tests.rollout.test_agent.hanging", {}))
    assert wf.timeout == 1.0 and wf.rows.failures is policy
    groups = wf.rollout(_samples(2), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    assert [g["rewards"].tolist() for g in groups] == [[-5.0], [1.0]]
    assert [(g.stats["agent/timeouts"].value, g.stats["agent/abandoned"].value) for g in groups] == [(1, 0), (0, 0)]


def test_every_rollout_call_runs_on_one_loop_and_a_class_agents_close_is_awaited_on_it(tok):
    wf = _workflow(Scripted(tok, "7"), tok, "tests.agents.simple.LoopBound")
    g = GenerationHyperparameters(n_samples=2, max_new_tokens=4)
    for _ in range(3):
        groups = wf.rollout(_samples(2), g)
        assert all(gr.stats["agent/errors"].value == 0 for gr in groups)
    agent = wf.instance
    wf.close()
    assert agent.closed_on is agent.loop and agent.loop.is_closed()


def test_a_call_waiting_for_episodes_that_cannot_ask_samples_what_is_queued_after_the_wait(tok, capsys):
    engine = Recording(Scripted(tok, "7"))
    wf = _workflow(engine, tok, "tests.agents.simple.FewConnections", batch_wait=0.2)
    groups = wf.rollout(_samples(3), GenerationHyperparameters(n_samples=2, max_new_tokens=4))
    assert all(g.stats["agent/errors"].value == 0 and g.stats["agent/calls"].value == 2 for g in groups)
    # 6 episodes, at most 2 requests out: the first call waited 0.2 s for the other four, then took the two.
    assert engine.sizes[0] == 2 and sum(engine.sizes) == 6
    assert sum(g.stats.get("agent/batch_wait_timeouts", Sum(0.0)).value for g in groups) >= 1
    err = capsys.readouterr().err
    assert err.count("stopped waiting for episodes") == 1 and "rollout.agent_batch_wait=0.2 s" in err


async def overflowing(data, *, client):
    """Episode 0 returns 1e39, 1 sets a reward of 1e308 (refused: 400), 2 returns {id: inf}, 3 returns 0.5."""
    r = await client.chat.completions.create(model="m", messages=data["messages"])
    if data["id"] == 0:
        return 1e39
    if data["id"] == 1:
        try:
            client.set_reward(r.id, 1e308)
        except Exception as e:  # noqa: BLE001 - the refusal is what is tested
            return 0.25 if "within float32" in str(e) else 0.0
    if data["id"] == 2:
        return {r.id: float("inf")}
    return 0.5


def test_agent_rewards_beyond_float32_are_bad_results_never_infinite_rows(tok, capsys):
    """1e39 and inf would be infinite float32 rewards: such an episode is a bad result (counted, trained with
    reward.error_value), and ``set_reward`` refuses a value beyond float32 with a 400."""
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.overflowing")  # error_value -1
    groups = wf.rollout(_samples(4), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    assert [g["rewards"].tolist() for g in groups] == [[-1.0], [0.25], [-1.0], [0.5]]
    assert [g.stats["agent/bad_results"].value for g in groups] == [1, 0, 1, 0]
    assert all(torch.isfinite(g["rewards"]).all() for g in groups)
    assert ("warning: rollout.agent tests.rollout.test_agent.overflowing: 2 of 4 episodes of this rollout had an "
            "unusable result (counted in agent/bad_results; scored reward.error_value=-1; the run stops above "
            "reward.max_error_fraction=0.5); the first: returned 1e+39; an agent returns a float reward (finite, "
            "within float32) or {completion_id: reward}") in capsys.readouterr().err.splitlines()


def test_unusable_results_stop_the_run_by_their_share_of_the_rollout_not_of_one_group(tok):
    """Groups of one (held-out evaluation, ``gconfig.n_samples=1``): one bad episode of four is counted, not
    fatal; all four are."""
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.overflowing")
    gconfig = GenerationHyperparameters(n_samples=1, max_new_tokens=4)
    by_id = _samples(4)  # 0: returns 1e39, 2: returns {id: inf}, 3: returns 0.5
    groups = wf.rollout([by_id[0], by_id[3], by_id[3]], gconfig)
    assert [g.stats["agent/bad_results"].value for g in groups] == [1, 0, 0]
    with pytest.raises(UserError, match=r"overflowing: 2 of 2 episodes of one rollout failed \(more than "
                                        r"reward.max_error_fraction=0.5\): 2 had an unusable result. Example: "
                                        r"returned 1e\+39"):
        wf.rollout([by_id[0], by_id[2]], gconfig)


async def sleeps_in_the_loop(data, *, client):
    """Blocks its event loop: ``time.sleep`` inside ``async def`` (episode 0 for ``data["pause"]`` s)."""
    await client.chat.completions.create(model="m", messages=data["messages"])
    if data["id"] == 0:
        time.sleep(data["pause"])
        await client.chat.completions.create(model="m", messages=data["messages"])
    return 1.0


def _paused(n, pause):
    return [dict(s, columns={"id": s["fields"]["id"], "pause": pause}) for s in _samples(n)]


def test_an_agent_that_blocks_the_loop_a_while_is_counted_named_and_timed_out(tok, capsys):
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.sleeps_in_the_loop", timeout=1.0)
    groups = wf.rollout(_paused(3, 1.6), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    assert groups[0].stats["agent/blocked"].value == 1
    # its episode ran past the timeout while it blocked: it ends as a timeout once the loop runs again
    assert [g["rewards"].tolist() for g in groups][1:] == [[1.0], [1.0]]
    assert sum(g.stats["agent/timeouts"].value for g in groups) >= 1
    err = capsys.readouterr().err
    assert "rollout.agent tests.rollout.test_agent.sleeps_in_the_loop: the agent blocked the episodes' event loop " \
           "for more than 1 s (counted in agent/blocked)" in err
    assert "time.sleep(data[\"pause\"])" in err  # the line that blocks
    wf.close()


def test_an_agent_that_blocks_the_loop_for_good_is_abandoned_at_its_timeout_and_the_run_goes_on(tok, capsys):
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.sleeps_in_the_loop", timeout=1.0)
    gconfig = GenerationHyperparameters(n_samples=2, max_new_tokens=4)
    start = time.monotonic()
    groups = wf.rollout(_paused(2, 3600), gconfig)
    assert time.monotonic() - start < 60  # the timeout and the grace, not the hour
    assert groups[0].stats["agent/blocked"].value == 1
    assert [g.stats["agent/timeouts"].value for g in groups] == [2, 2]
    assert all(g["loss_mask"].sum() == 0 for g in groups)  # nothing of the lost rollout is trained
    assert [g.stats["agent/abandoned"].value for g in groups] == [2, 2]
    err = capsys.readouterr().err
    assert ("warning: rollout.agent tests.rollout.test_agent.sleeps_in_the_loop: 4 of 4 episodes of this rollout "
            "were abandoned with the episodes' event loop") in err
    assert "the rollout's 4 episodes end as timeouts (untrained) and the next rollout starts on a new loop" in err
    later = wf.rollout(_paused(2, 0), gconfig)  # a new loop
    assert all(g["rewards"].eq(1.0).all() and g.stats["agent/timeouts"].value == 0 for g in later)
    assert later[0].stats["agent/blocked"].value == 0
    wf.close()


async def http_sleeps_in_the_loop(data, *, base_url, api_key):
    """Over HTTP: one request, then (episode 0 when ``data["pause"]``) blocks its loop, which serves the endpoint."""
    import httpx

    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(base_url + "/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                            json={"model": "m", "messages": data["messages"]})
        r.raise_for_status()
        if data["id"] == 0 and data["pause"]:
            time.sleep(data["pause"])
    return 1.0


def test_an_http_agent_that_blocks_the_loop_for_good_leaves_its_endpoint_and_the_next_rollout_serves_anew(tok):
    """The endpoint serves on the episodes' loop: abandoned with it, and the next rollout starts another."""
    wf = _workflow(Scripted(tok, "7"), tok, "tests.rollout.test_agent.http_sleeps_in_the_loop", timeout=1.0)
    gconfig = GenerationHyperparameters(n_samples=2, max_new_tokens=4)
    wf.rollout(_paused(1, 3600), gconfig)
    assert wf.server is None and wf._loop is None
    later = wf.rollout(_paused(2, 0), gconfig)
    assert all(g["rewards"].eq(1.0).all() and g.stats["agent/timeouts"].value == 0 for g in later)
    assert wf.server._task.get_loop() is wf._loop.loop
    wf.close()
