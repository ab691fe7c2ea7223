"""One calculator agent written against the ``openai`` package, in the two documented forms: with the
trainer's client (``run_client``) and with its own ``openai.AsyncOpenAI`` on the run's HTTP endpoint
(``run_http``). It runs its own tool (no ``client.call_tool``), in a worker thread, and waits a random
few milliseconds before each request, so the two forms reach the engine at different times."""

from __future__ import annotations

import asyncio
import json
import random
import re

import openai

from examples.agents.calculator.agent import calc

CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
_jitter = random.Random()  # unseeded on purpose: real timing noise, never the trainer's random state


def _final(text: str | None) -> str | None:
    found = re.findall(r"####\s*(-?\d+)", text or "")
    return found[-1] if found else None


def _run_calc(arguments: str) -> str:
    try:
        return calc(**json.loads(arguments))
    except Exception as e:  # noqa: BLE001 - the model sees the error
        return f"Error: {e}"


async def solve(data, client, max_turns: int = 3) -> float:
    messages = list(data["messages"])
    for _ in range(max_turns):
        await asyncio.sleep(_jitter.uniform(0, 0.01))
        reply = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=[CALC])
        message = reply.choices[0].message
        if not message.tool_calls:
            return float(_final(message.content) is not None and _final(message.content) == _final(data["answer"]))
        messages.append(message)
        for call in message.tool_calls:
            result = await asyncio.to_thread(_run_calc, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0


async def run_client(data, *, client):
    return await solve(data, client)


async def run_http(data, *, base_url, api_key):
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        return await solve(data, client)
