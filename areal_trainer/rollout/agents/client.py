"""The clients an agent's ``run`` is handed: they look like ``openai.AsyncOpenAI`` / ``openai.OpenAI``.

:class:`AgentClient` (async, for ``async def run``) and :class:`SyncAgentClient` (blocking, for a plain
``def run``, which runs in a worker thread): ``client.chat.completions.create(model=..., messages=...,
tools=..., ...)``. Any ``model`` name is accepted and always reaches the policy being trained. Beyond
OpenAI's API they offer ``set_reward(completion_id, reward)`` (a per-call reward) and
``call_tool(tool_call, tools)``, which runs a tool on the model's arguments and returns the
``role: tool`` message. Each call's keyword arguments are checked as an HTTP request body would be
(``requests.py``) and served by the episode's :class:`~areal_trainer.rollout.agents.session.EpisodeSession`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .openai_types import ChatCompletion
from .requests import ChatRequest, RequestError, parse_chat_request
from .session import EpisodeSession, as_tool


def request_body(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``create(**kwargs)`` as a request body: response messages and ``Tool`` objects become dicts."""
    body = {k: v for k, v in kwargs.items() if v is not None and k not in ("extra_headers", "extra_body", "timeout")}
    body.update(kwargs.get("extra_body") or {})
    if isinstance(body.get("messages"), list):
        body["messages"] = [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m
                            for m in body["messages"]]
    if isinstance(body.get("tools"), list):
        body["tools"] = [as_tool(t).to_openai() if not isinstance(t, dict) else t for t in body["tools"]]
    return body


def parse_request(session: EpisodeSession, kwargs: dict[str, Any]) -> ChatRequest:
    """``create(**kwargs)`` as a checked request; a malformed one is counted as the session's and raised."""
    try:
        return parse_chat_request(request_body(kwargs))
    except RequestError as e:
        session.bad_request(e)
        raise


@dataclass
class _Completions:
    session: EpisodeSession

    async def create(self, **kwargs: Any) -> ChatCompletion:
        return await self.session.create(parse_request(self.session, kwargs))


@dataclass
class _Chat:
    completions: Any


class AgentClient:
    """``openai.AsyncOpenAI``-like client of one episode (``await client.chat.completions.create(...)``)."""

    def __init__(self, session: EpisodeSession):
        self.session = session
        self.chat = _Chat(_Completions(session))

    def set_reward(self, completion_id: str | None, reward: float) -> None:
        """Reward the call ``completion_id`` (None: the latest call); unrewarded calls get 0 (see
        ``rollout.turn_discount`` for how later rewards reach earlier calls)."""
        self.session.set_reward_now(completion_id, reward)

    async def call_tool(self, tool_call: Any, tools: Sequence[Any], *, timeout: float | None = None) -> dict:
        """Run a tool call of the model; the ``role: tool`` message to send back (see ``EpisodeSession``)."""
        return await self.session.call_tool(tool_call, tools, timeout=timeout)


@dataclass
class _SyncCompletions:
    session: EpisodeSession
    loop: asyncio.AbstractEventLoop

    def create(self, **kwargs: Any) -> ChatCompletion:
        coro = self.session.create(parse_request(self.session, kwargs))
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


@dataclass
class SyncAgentClient:
    """``openai.OpenAI``-like blocking client, for an agent's plain ``def run`` (run in a worker thread)."""

    session: EpisodeSession
    loop: asyncio.AbstractEventLoop
    chat: Any = field(init=False)

    def __post_init__(self) -> None:
        self.chat = _Chat(_SyncCompletions(self.session, self.loop))

    def set_reward(self, completion_id: str | None, reward: float) -> None:
        self.session.set_reward_now(completion_id, reward)

    def call_tool(self, tool_call: Any, tools: Sequence[Any], *, timeout: float | None = None) -> dict:
        coro = self.session.call_tool(tool_call, tools, timeout=timeout)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
