"""The HTTP endpoint as an agent in another process meets it: the real ``openai`` client against
``EndpointServer`` serving real ``EpisodeSession``s, whose coroutines run on an event loop of their
own thread (``LoopHandler``), as in the trainer. With the built-in tiny model (random weights): plain
chat, ``n > 1``, tools, ``role: tool`` messages, rewards, errors and the row limit, and that every
recorded id is the engine's own. A scripted engine over a byte-level tokenizer with a hermes chat
template writes a real tool call, to check tool calls end to end."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import httpx
import openai
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from areal_trainer.config.sampling import GenerationHyperparameters
from areal_trainer.model.builtin import build_model
from areal_trainer.model.chat import prompt_ids
from areal_trainer.rollout.agents.endpoint import EndpointServer, LoopHandler
from areal_trainer.rollout.agents.session import EpisodeSession
from areal_trainer.rollout.agents.tool_parsers import get_parser
from areal_trainer.rollout.engines.batcher import GenerationBatcher
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.rollout.types import Generation

CPU = torch.device("cpu")
TIMEOUT = 60  # seconds per request: generous for shared CPUs, short enough that a hang fails the test
G = GenerationHyperparameters(max_new_tokens=6, max_tokens=64, temperature=1.0)
QUESTION = [{"role": "user", "content": "Tom has 3 apples. Tom buys 4 more. How many apples does Tom have now?"}]
ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


class RecordingEngine:
    """An engine that remembers every prompt it got and every answer it returned."""

    def __init__(self, inner):
        self.inner, self.max_positions = inner, inner.max_positions
        self.prompts: list[list[int]] = []
        self.answers: list[Generation] = []
        self.lock = threading.Lock()

    def generate(self, prompts, gconfig):
        gens = self.inner.generate(prompts, gconfig)
        with self.lock:
            self.prompts += [list(p) for p in prompts]
            self.answers += gens
        return gens


class LoopThread:
    """An event loop running in a thread of its own: where the trainer runs episodes."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="episode-loop", daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


class Stack:
    """A server, a loop thread, an engine behind a batcher, and a way to open episodes on them."""

    def __init__(self, engine, tokenizer, parser="hermes"):
        self.engine, self.tokenizer, self.parser = engine, tokenizer, get_parser(parser)
        self.loop = LoopThread()
        self.batcher = GenerationBatcher(engine)
        self.server = EndpointServer()
        self.server.start()

    def episode(self, gconfig=G, index=0, **limits):
        session = EpisodeSession(episode=index, tokenizer=self.tokenizer, batcher=self.batcher, gconfig=gconfig,
                                 parser=self.parser, **limits)
        return session, self.server.open_episode(LoopHandler(session, self.loop.loop))

    def client(self, key, cls=openai.OpenAI):
        return cls(base_url=self.server.base_url, api_key=key, max_retries=0, timeout=TIMEOUT)

    def close(self):
        self.server.stop()
        self.loop.run(self.batcher.close())
        self.loop.close()


@pytest.fixture(scope="module")
def stack(tok):
    engine = RecordingEngine(HFEngine(build_model("builtin:tiny", tok, seed=0).eval(), tok, device=CPU))
    s = Stack(engine, tok)
    yield s
    s.close()
    assert not s.server._thread and not s.loop.thread.is_alive()


@pytest.fixture
def episode(stack):
    session, key = stack.episode()
    yield session, key
    stack.server.close_episode(key)


# -- chat with the built-in model ---------------------------------------------------------------

def test_plain_chat(stack, episode, tok):
    session, key = episode
    r = stack.client(key).chat.completions.create(model="my-model", messages=QUESTION, temperature=0)
    (rec,) = session.records
    assert r.id == rec.completion_id and r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.model == "my-model" and len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.tool_calls is None
    assert choice.message.content == tok.decode(rec.output_ids, skip_special_tokens=True)
    assert choice.finish_reason == ("length" if rec.truncated else "stop")
    assert r.usage.prompt_tokens == len(rec.prompt_ids)
    assert r.usage.completion_tokens == len(rec.output_ids) <= G.max_new_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert session.counters.calls == 1


def test_recorded_ids_are_the_engines_and_the_prompt_is_the_chat_template(stack, episode, tok):
    session, key = episode
    messages = [{"role": "system", "content": "There are 3 apples."}, *QUESTION]
    before = len(stack.engine.answers)
    stack.client(key).chat.completions.create(model="policy", messages=messages, max_tokens=4)
    (rec,) = session.records
    (prompt,), (gen,) = stack.engine.prompts[before:], stack.engine.answers[before:]
    assert rec.prompt_ids == prompt == prompt_ids(tok, messages)
    assert (rec.output_ids, rec.logprobs, rec.versions, rec.truncated) == (
        gen.output_ids, gen.logprobs, gen.versions, gen.truncated)
    assert len(rec.output_ids) <= 4 and all(v == 0 for v in rec.versions)


def test_n_choices_are_n_records(stack, episode, tok):
    session, key = episode
    torch.manual_seed(0)
    r = stack.client(key).chat.completions.create(model="policy", messages=QUESTION, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [(x.completion_id, x.index, x.call) for x in session.records] == [(r.id, i, 0) for i in range(3)]
    for c, rec in zip(r.choices, session.records):
        assert c.message.content == tok.decode(rec.output_ids, skip_special_tokens=True)
        assert rec.prompt_ids == prompt_ids(tok, QUESTION)
    assert r.usage.completion_tokens == sum(len(x.output_ids) for x in session.records)
    assert r.usage.prompt_tokens == len(session.records[0].prompt_ids)  # the prompt once, as OpenAI counts it


def test_a_request_with_tools_and_a_tool_message(stack, episode, tok):
    session, key = episode
    client = stack.client(key)
    r = client.chat.completions.create(model="policy", messages=QUESTION, tools=[ADD_TOOL], temperature=0)
    # The random model writes no call; the answer is plain content.
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]}
    tool = {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "7"}
    client.chat.completions.create(model="policy", messages=[*QUESTION, assistant, tool], tools=[ADD_TOOL],
                                   temperature=0)
    second = session.records[1]
    assert second.call == 1
    expected = [*QUESTION, {**assistant, "tool_calls": [{**assistant["tool_calls"][0], "function": {
        "name": "add", "arguments": {"a": 3, "b": 4}}}]}, tool]
    text = tok.apply_chat_template(expected, tools=[ADD_TOOL], add_generation_prompt=True, tokenize=False)
    assert second.prompt_ids == tok(text, add_special_tokens=False).input_ids
    assert tok.decode(second.prompt_ids).endswith("\n7<|im_end|>\n<|im_start|>assistant\n")  # the tool's result


def test_set_reward_lands_on_the_record(stack, episode):
    session, key = episode
    client = stack.client(key)
    first = client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=2)
    client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=2)
    # Relative to base_url (.../v1), as the openai client and most agents join paths.
    got = client.post("/rl/set_reward", body={"completion_id": first.id, "reward": 0.25}, cast_to=object)
    assert got == {"ok": True, "completion_id": first.id, "reward": 0.25}
    # At the server's root, without an id: the latest call.
    root = stack.server.base_url.removesuffix("/v1")
    resp = httpx.post(f"{root}/rl/set_reward", json={"reward": 1}, headers={"Authorization": f"Bearer {key}"},
                      timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    assert [x.reward for x in session.records] == [0.25, 1.0]
    with pytest.raises(openai.NotFoundError, match="no call of this episode"):
        client.post("/rl/set_reward", body={"completion_id": "chatcmpl-nope", "reward": 1.0}, cast_to=object)
    with pytest.raises(openai.BadRequestError, match="reward") as e:
        client.post("/rl/set_reward", body={"reward": "high"}, cast_to=object)
    assert e.value.body["param"] == "reward"


def test_concurrent_episodes_with_the_async_client_see_only_their_own_calls(stack, tok):
    episodes = [stack.episode(index=i) for i in range(3)]

    async def one(key, text):
        async with stack.client(key, openai.AsyncOpenAI) as client:
            return await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": text}], max_tokens=3)

    async def all_at_once(texts):
        return await asyncio.gather(*(one(key, t) for (_, key), t in zip(episodes, texts)))

    try:
        texts = [f"Tom has {i} apples." for i in range(3)]
        results = asyncio.run(asyncio.wait_for(all_at_once(texts), TIMEOUT))
        for (session, _), r, t in zip(episodes, results, texts):
            (rec,) = session.records
            assert rec.completion_id == r.id and rec.prompt_ids == prompt_ids(tok, [{"role": "user", "content": t}])
    finally:
        for _, key in episodes:
            stack.server.close_episode(key)


# -- the row limit ------------------------------------------------------------------------------

def test_a_prompt_over_the_row_limit_is_a_length_answer(stack, episode):
    session, key = episode
    long = [{"role": "user", "content": " ".join(["apples"] * (G.max_tokens + 10))}]
    before = len(stack.engine.prompts)
    r = stack.client(key).chat.completions.create(model="policy", messages=long, n=2)
    assert [c.finish_reason for c in r.choices] == ["length", "length"]
    assert all(c.message.content == "" for c in r.choices)
    assert r.usage.prompt_tokens > G.max_tokens and r.usage.completion_tokens == 0
    assert not session.records and len(stack.engine.prompts) == before  # nothing sampled, nothing trained
    assert session.counters.length_refusals == 1


def test_an_answer_stops_at_the_row_limit(stack, tok):
    room = 2
    prompt_len = len(prompt_ids(tok, QUESTION))
    session, key = stack.episode(GenerationHyperparameters(max_new_tokens=6, max_tokens=prompt_len + room))
    try:
        r = stack.client(key).chat.completions.create(model="policy", messages=QUESTION, temperature=0)
    finally:
        stack.server.close_episode(key)
    (rec,) = session.records
    assert len(rec.output_ids) <= room
    assert r.choices[0].finish_reason == ("length" if rec.truncated else "stop")


# -- errors -------------------------------------------------------------------------------------

def test_missing_wrong_and_closed_keys_are_401(stack, episode):
    session, key = episode
    no_key = {"Authorization": openai.omit}  # the client refuses to start without a key; send none
    with pytest.raises(openai.AuthenticationError, match="Missing API key") as e:
        stack.client(key).chat.completions.create(model="policy", messages=QUESTION, extra_headers=no_key)
    assert e.value.status_code == 401 and e.value.code == "missing_api_key"
    with pytest.raises(openai.AuthenticationError, match="Invalid API key") as e:
        stack.client(key + "x").chat.completions.create(model="policy", messages=QUESTION)
    assert e.value.code == "invalid_api_key"
    _, closed = stack.episode()
    stack.server.close_episode(closed)
    with pytest.raises(openai.AuthenticationError, match="not the key of an open episode"):
        stack.client(closed).chat.completions.create(model="policy", messages=QUESTION)
    with pytest.raises(openai.AuthenticationError):
        stack.client(closed).post("/rl/set_reward", body={"reward": 1.0}, cast_to=object)
    assert not session.records


@pytest.mark.parametrize("body, field", [
    (dict(messages=[]), "messages"),
    (dict(messages=QUESTION, temperature=5), "temperature"),
    (dict(messages=QUESTION, n=0), "n"),
    (dict(messages=[{"role": "robot", "content": "hi"}]), "messages[0].role"),
    (dict(messages=QUESTION, tools=[{"type": "function", "function": {"description": "no name"}}]), "tools[0]"),
])
def test_a_bad_body_is_400_naming_the_field(stack, episode, body, field):
    session, key = episode
    with pytest.raises(openai.BadRequestError) as e:
        stack.client(key).chat.completions.create(model="policy", **body)
    assert e.value.status_code == 400 and e.value.body["param"] == field and field in e.value.message
    assert not session.records and session.counters.calls == 0


def test_unknown_route_is_a_json_404(stack, episode):
    _, key = episode
    with pytest.raises(openai.NotFoundError, match="Unknown route") as e:
        stack.client(key).get("/nothing/here", cast_to=object)
    assert e.value.body["type"] == "invalid_request_error"
    resp = httpx.get(stack.server.base_url + "/nothing", timeout=TIMEOUT)
    assert resp.status_code == 404 and "/v1/chat/completions" in resp.json()["error"]["message"]


def test_models_lists_the_policy(stack, episode):
    _, key = episode
    assert [m.id for m in stack.client(key).models.list()] == ["policy"]


# -- tool calls end to end (a scripted engine) --------------------------------------------------

HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte (any text round-trips), ChatML specials, and a hermes tool-call template."""
    specials = ["<eos>", "<|im_start|>", "<|im_end|>"]
    vocab = {c: i for i, c in enumerate([*specials, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>",
                                  additional_special_tokens=specials[1:])
    tok.chat_template = HERMES_TEMPLATE
    return tok


class ScriptedEngine:
    """Answers every prompt with the next text of ``script`` (then EOS), as token ids."""

    max_positions = None

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer, self.script = tokenizer, list(script)
        self.prompts: list[list[int]] = []
        self.answers: list[Generation] = []

    def generate(self, prompts, gconfig):
        gens = []
        for _ in prompts:
            ids = self.tokenizer(self.script.pop(0), add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
            gens.append(Generation(ids, [-0.5] * len(ids), False, [7] * len(ids)))
        self.prompts += [list(p) for p in prompts]
        self.answers += gens
        return gens


@pytest.fixture
def scripted():
    tok = byte_tokenizer()
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    engine = ScriptedEngine(tok, [f"Let me add. {call}", "Tom has 7 apples."])
    s = Stack(engine, tok)
    session, key = s.episode(GenerationHyperparameters(max_new_tokens=200, max_tokens=4096))
    yield s, session, key
    s.close()


def test_a_tool_call_reaches_the_openai_client_and_its_result_the_next_prompt(scripted):
    stack, session, key = scripted
    tok, client = stack.tokenizer, stack.client(key)
    r = client.chat.completions.create(model="policy", messages=QUESTION, tools=[ADD_TOOL])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 3, "b": 4}
    rec = session.records[0]
    assert (rec.output_ids, rec.logprobs, rec.versions) == (
        stack.engine.answers[0].output_ids, stack.engine.answers[0].logprobs, [7] * len(rec.output_ids))
    assert rec.prompt_ids == stack.engine.prompts[0] == tok(
        tok.apply_chat_template(QUESTION, tools=[ADD_TOOL], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False).input_ids

    # The agent sends the response message back as it got it, with the tool's result.
    result = {"role": "tool", "tool_call_id": call.id, "name": "add", "content": "7"}
    messages = [*QUESTION, choice.message.model_dump(exclude_none=True), result]
    r2 = client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL])
    assert r2.choices[0].finish_reason == "stop" and r2.choices[0].message.content == "Tom has 7 apples."
    text = tok.decode(session.records[1].prompt_ids)
    assert text.endswith('<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>\n'
                         "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert session.records[1].prompt_ids == stack.engine.prompts[1]
    assert session.counters.tool_parse_failures == 0


def test_tool_choice_none_leaves_the_call_in_the_content(scripted):
    stack, session, key = scripted
    r = stack.client(key).chat.completions.create(model="policy", messages=QUESTION, tools=[ADD_TOOL],
                                                  tool_choice="none")
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert "<tool_call>" in r.choices[0].message.content


# -- http agents run by the agent workflow ------------------------------------------------------

KEYS: list[str] = []


async def async_http_agent(data, *, base_url, api_key):
    """The AsyncOpenAI client on the episode's own loop; rewards the call over HTTP."""
    KEYS.append(api_key)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=TIMEOUT) as client:
        r = await client.chat.completions.create(model="policy", messages=data["messages"], max_tokens=3)
        await client.post("/rl/set_reward", body={"completion_id": r.id, "reward": 0.5}, cast_to=object)
    return {r.id: 0.5}


def sync_http_agent(data, *, base_url, api_key):
    """A plain def (run in a worker thread) with the blocking client: two calls."""
    KEYS.append(api_key)
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=TIMEOUT) as client:
        messages = list(data["messages"])
        for _ in range(2):
            r = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "?"}]
    return 1.0


def reporting_http_agent(data, *, base_url, api_key):
    """Reports its reward over HTTP as it goes, and returns none of its own."""
    KEYS.append(api_key)
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=TIMEOUT) as client:
        client.chat.completions.create(model="policy", messages=data["messages"], max_tokens=2)
        client.post("/rl/set_reward", body={"reward": 0.75}, cast_to=object)
    return {}


async def hanging_http_agent(data, *, base_url, api_key):
    KEYS.append(api_key)
    await asyncio.sleep(3600)


SAMPLE = {"messages": QUESTION, "prompt": QUESTION[0]["content"], "answer": "3 + 4 = 7\n#### 7"}


def _workflow(stack, name, **kwargs):
    from areal_trainer.rollout.agents.spec import load_agent
    from areal_trainer.rollout.agents.workflow import AgentWorkflow

    return AgentWorkflow(engine=stack.engine, tokenizer=stack.tokenizer, reward=None,
                         agent=load_agent(f"{__name__}.{name}", {}), **kwargs)


def _key_works(stack, key) -> bool:
    try:
        stack.client(key).models.list()
        return True
    except openai.AuthenticationError:
        return False


@pytest.mark.parametrize("name, calls, reward", [("async_http_agent", 1, 0.5), ("sync_http_agent", 2, 1.0),
                                                  ("reporting_http_agent", 1, 0.75)])
def test_the_workflow_serves_http_agents_one_key_per_episode(stack, name, calls, reward):
    KEYS.clear()
    wf = _workflow(stack, name, server=stack.server)
    groups = wf.rollout([SAMPLE, SAMPLE], GenerationHyperparameters(n_samples=2, max_new_tokens=4))
    assert len(KEYS) == len(set(KEYS)) == 4
    assert not any(_key_works(stack, k) for k in KEYS)  # a key ends with its episode
    for g in groups:
        assert g.episode_rows == (calls, calls) and g.episode_rewards == (reward, reward)
        assert g.stats["agent/calls"].value == 2 * calls and g.stats["agent/errors"].value == 0


def test_the_workflow_starts_one_server_for_its_http_agent_on_the_episodes_loop(stack):
    wf = _workflow(stack, "async_http_agent")
    try:
        wf.rollout([SAMPLE], GenerationHyperparameters(n_samples=2, max_new_tokens=4))
        port = wf.server.port
        wf.rollout([SAMPLE], GenerationHyperparameters(n_samples=1, max_new_tokens=4))
        assert wf.server.port == port and wf.server.host == "127.0.0.1"
        assert wf.server._task.get_loop() is wf._loop.loop  # no thread of its own: no hop per request
        assert not any(t.name == f"areal-endpoint-{port}" for t in threading.enumerate())
    finally:
        wf.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the port is free again


def test_a_timed_out_http_episode_loses_its_key(stack):
    KEYS.clear()
    wf = _workflow(stack, "hanging_http_agent", timeout=0.5, server=stack.server)
    (group,) = wf.rollout([SAMPLE], GenerationHyperparameters(n_samples=2, max_new_tokens=4))
    assert group.stats["agent/timeouts"].value == 2 and group.stats["agent/episodes"].value == 2
    assert len(KEYS) == 2 and not any(_key_works(stack, k) for k in KEYS)
