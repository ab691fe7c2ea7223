"""An agent whose episodes spend most of their wall time waiting on tools, for ``scripts/bench_agents.py``.

Each episode makes ``calls`` model calls; after each one it waits ``latency`` seconds, as an agent
waits on a sandbox, a search engine or a web request (the wait holds no CPU, so other episodes and
the trainer run meanwhile). The reply to the model is a fixed tool message. The reward is the
built-in task's check of the last answer (``gsm8k_reward_fn``), so a run with this agent learns
what the task's ordinary runs learn.

    python -m areal_trainer --config-name grpo rollout.agent=examples.agents.bench_agent.BenchAgent \\
        '+rollout.agent_kwargs={calls: 3, latency: 0.2}'
"""

from __future__ import annotations

import asyncio

from areal_trainer.reward.math import gsm8k_reward_fn


class BenchAgent:
    """``calls`` model calls per episode, each followed by a tool that takes ``latency`` seconds."""

    def __init__(self, calls: int = 3, latency: float = 0.2, max_tokens: int | None = None):
        self.calls, self.latency, self.max_tokens = int(calls), float(latency), max_tokens

    async def run(self, data, *, client):
        return await self.episode(data, client)

    async def episode(self, data, client) -> float:
        messages = list(data["messages"])
        content = ""
        for _ in range(self.calls):
            r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=self.max_tokens)
            content = r.choices[0].message.content or ""
            await asyncio.sleep(self.latency)  # the tool call
            messages += [{"role": "assistant", "content": content}, {"role": "tool", "content": "tool result"}]
        return gsm8k_reward_fn(data.get("prompt"), content, data.get("answer"))
