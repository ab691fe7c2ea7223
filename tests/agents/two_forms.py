"""The calculator agent of ``examples/agents/calculator/openai_agent.py`` in its two forms, with a random wait
of up to 10 ms before each request (unseeded: real timing noise, never the trainer's random state), so that
the two forms' requests reach the engine at different times."""

from __future__ import annotations

import asyncio
import random
import types

from examples.agents.calculator.openai_agent import HTTPAgent, solve

_jitter = random.Random()


class Jittery:
    """A client whose requests each wait a random few milliseconds first."""

    def __init__(self, client):
        self.client = client
        self.chat = types.SimpleNamespace(completions=types.SimpleNamespace(create=self.create))

    async def create(self, **kwargs):
        await asyncio.sleep(_jitter.uniform(0, 0.01))
        return await self.client.chat.completions.create(**kwargs)


async def run_client(data, *, client):
    return await solve(data, Jittery(client))


class HTTP(HTTPAgent):
    async def run(self, data, *, base_url, api_key):
        import openai

        if self.client is None:
            self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        return await solve(data, Jittery(self.client.with_options(base_url=base_url, api_key=api_key)))
