"""Agents used by the tests: each exercises one part of the agent contract."""

from __future__ import annotations

import asyncio
import re


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
