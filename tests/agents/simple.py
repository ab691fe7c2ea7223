"""Agents used by the tests: each exercises one part of the agent contract."""

from __future__ import annotations

import asyncio
import re
import time


def _number(text: str | None) -> str | None:
    found = re.findall(r"-?\d+", text or "")
    return found[-1] if found else None


async def answer_once(data, *, client):
    """One call; reward 1 when the last number of the reply is the answer's."""
    r = await client.chat.completions.create(model="any-name", messages=data["messages"])
    return float(_number(r.choices[0].message.content) == _number(str(data["answer"]).split("####")[-1]))


async def try_again(data, *, client, max_turns: int = 2):
    """The multi-turn "try again" loop: answer, and while wrong, hear so and answer again."""
    messages = list(data["messages"])
    target = _number(str(data["answer"]).split("####")[-1])
    for _ in range(max_turns):
        r = await client.chat.completions.create(model="policy", messages=messages)
        content = r.choices[0].message.content
        if _number(content) == target:
            return 1.0
        messages += [{"role": "assistant", "content": content},
                     {"role": "user", "content": "Your answer is incorrect. Please try again."}]
    return 0.0


class SlowAgent:
    """Sleeps ``delay`` seconds after each of ``calls`` calls, as a tool would."""

    def __init__(self, calls: int = 2, delay: float = 0.2):
        self.calls, self.delay = calls, delay

    async def run(self, data, *, client):
        messages = list(data["messages"])
        for _ in range(self.calls):
            r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
            await asyncio.sleep(self.delay)
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": "more"}]
        return 1.0


def sync_agent(data, *, client):
    """A plain def: runs in a worker thread with a blocking client."""
    r = client.chat.completions.create(model="policy", messages=data["messages"])
    client.set_reward(r.id, 0.5)
    return {r.id: 0.5}


SEARCH = {"type": "function", "function": {"name": "search_web", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}}}}
"""A tool whose name and argument the built-in tokenizers cannot spell."""
BROKEN_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "search_web", "arguments": "{query: 'x'"}}]}
"""An assistant message whose tool-call arguments are not JSON."""


async def misbehaving(data, *, client):
    """Refused requests, each caught: a reward before the first call, tool-call arguments that are not JSON,
    then one good call (with a tool the tokenizer cannot spell), then a reward for an unknown completion id."""
    from areal_trainer.rollout.agents.requests import RequestError

    refused = []
    for attempt in (lambda: client.set_reward(None, 1.0),
                    lambda: client.chat.completions.create(model="m", messages=[*data["messages"], BROKEN_CALL])):
        try:
            result = attempt()
            if asyncio.iscoroutine(result):
                await result
        except RequestError as e:
            refused.append(e.status)
    r = await client.chat.completions.create(model="m", messages=data["messages"], tools=[SEARCH])
    try:
        client.set_reward("chatcmpl-unknown", 1.0)
    except RequestError as e:
        refused.append(e.status)
    if refused != [404, 400, 404]:
        raise AssertionError(f"refused with {refused}")
    return float(bool(r.choices[0].message.content))


async def misbehaving_http(data, *, base_url, api_key):
    """:func:`misbehaving` over the HTTP endpoint with the ``openai`` package: its usual exceptions."""
    import openai

    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        refused = []
        try:
            await client.post("/rl/set_reward", body={"reward": 1.0}, cast_to=object)
        except openai.NotFoundError:
            refused.append(404)
        try:
            await client.chat.completions.create(model="m", messages=[*data["messages"], BROKEN_CALL])
        except openai.BadRequestError as e:
            refused.append(400)
            assert "messages[1].tool_calls[0].function.arguments" in str(e), e
        r = await client.chat.completions.create(model="m", messages=data["messages"], tools=[SEARCH])
        try:
            await client.post("/rl/set_reward", body={"completion_id": "chatcmpl-unknown", "reward": 1.0},
                              cast_to=object)
        except openai.NotFoundError:
            refused.append(404)
    if refused != [404, 400, 404]:
        raise AssertionError(f"refused with {refused}")
    return float(bool(r.choices[0].message.content))


class LoopBound:
    """Keeps what it made on its first episode's event loop (as a client or a session is bound to one) and
    checks that every later episode runs on that loop; ``close()`` records the loop it was awaited on."""

    def __init__(self):
        self.loop = None
        self.closed_on = None

    async def run(self, data, *, client):
        loop = asyncio.get_running_loop()
        self.loop = self.loop or loop
        if loop is not self.loop:
            raise RuntimeError("an episode ran on another event loop than the first one")
        r = await client.chat.completions.create(model="m", messages=data["messages"], max_tokens=2)
        return float(bool(r.choices[0].message.content))

    async def close(self):
        self.closed_on = asyncio.get_running_loop()


class FewConnections:
    """Lets only ``connections`` of its episodes have a request out at once, as an HTTP client with a small
    connection limit does: the others wait for a free connection, so a call that waits for every episode in
    flight would wait for ever."""

    def __init__(self, connections: int = 2):
        self.connections, self.slots = connections, None

    async def run(self, data, *, client):
        self.slots = self.slots or asyncio.Semaphore(self.connections)
        async with self.slots:
            r = await client.chat.completions.create(model="m", messages=data["messages"], max_tokens=2)
        return float(bool(r.choices[0].message.content))


async def blocks_its_loop(data, *, client, every: int = 5, seconds: float = 3600.0):
    """Every ``every``-th episode (by the order episodes start) blocks its event loop with ``time.sleep``
    inside ``async def``: the mistake the trainer must survive."""
    _started[0] += 1
    mine = _started[0]
    r = await client.chat.completions.create(model="any-name", messages=data["messages"])
    if mine % every == 0:
        time.sleep(seconds)
    return float(bool(r.choices[0].message.content))


_started = [0]


async def bad_result_every(data, *, client, every: int = 5):
    """Every ``every``-th episode (by the order episodes start) returns text where a reward belongs."""
    _returned[0] += 1
    mine = _returned[0]
    r = await client.chat.completions.create(model="any-name", messages=data["messages"])
    return "no reward today" if mine % every == 0 else float(bool(r.choices[0].message.content))


_returned = [0]
