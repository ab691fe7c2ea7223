"""Agents written against the ``openai`` package, in their two forms (the trainer's client, or the HTTP
endpoint with an ``openai.AsyncOpenAI`` on aiohttp), with a random wait of up to 10 ms before each request (unseeded:
real timing noise, never the trainer's random state), so that the two forms' requests reach the engine at
different times. ``task``: ``calculator`` (``examples/agents/calculator/openai_agent.py``), ``try_again``
(answer; when the final number is wrong, hear so and answer again) or ``picture`` (one call with the row's
messages, its pictures as ``image_url`` parts)."""

from __future__ import annotations

import asyncio
import random
import re
import types

from examples.agents.calculator.openai_agent import HTTPAgent, async_client, solve

_jitter = random.Random()


class Jittery:
    """A client whose requests each wait a random few milliseconds first."""

    def __init__(self, client):
        self.client = client
        self.chat = types.SimpleNamespace(completions=types.SimpleNamespace(create=self.create))

    async def create(self, **kwargs):
        await asyncio.sleep(_jitter.uniform(0, 0.01))
        return await self.client.chat.completions.create(**kwargs)


def _number(text: str | None) -> str | None:
    found = re.findall(r"-?\d+", text or "")
    return found[-1] if found else None


async def try_again(data, client, max_turns: int = 2) -> float:
    messages = list(data["messages"])
    target = _number(str(data["answer"]).split("####")[-1])
    for _ in range(max_turns):
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=24)
        content = r.choices[0].message.content or ""
        if _number(content) == target:
            return 1.0
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "Wrong. Try again."}]
    return 0.0


async def picture(data, client) -> float:
    """One call with the row's messages as they come (an image prompt's pictures as ``image_url`` parts); 1 when
    the reply's first word is the answer."""
    r = await client.chat.completions.create(model="policy", messages=data["messages"])
    words = (r.choices[0].message.content or "").split()
    return float(bool(words) and words[0].strip(".").lower() == str(data["answer"]).lower())


TASKS = {"calculator": solve, "try_again": try_again, "picture": picture}


async def run_client(data, *, client, task: str = "calculator"):
    return await TASKS[task](data, Jittery(client))


class HTTP(HTTPAgent):
    def __init__(self, task: str = "calculator"):
        super().__init__()
        self.task = task

    async def run(self, data, *, base_url, api_key):
        if self.client is None:
            self.client = async_client(base_url, api_key)  # on aiohttp, as docs/agents_http.md recommends
        return await TASKS[self.task](data, Jittery(self.client.with_options(base_url=base_url, api_key=api_key)))
