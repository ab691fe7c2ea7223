"""Agent code as a rollout: ``rollout.agent=<import path>`` runs the user's agent once per episode.

The contract. ``rollout.agent`` names an async function, or a class whose instances have a ``run``
method (the class is built once with ``rollout.agent_kwargs``; a function gets them with every call).
It is called as ``run(data, *, client)`` or ``run(data, *, base_url, api_key)``, whichever parameters
it declares: ``data`` is the dataset row (every column, plus ``messages``, the prompt as chat
messages), ``client`` behaves like ``openai.AsyncOpenAI`` (``client.py``), and ``base_url`` /
``api_key`` address the run's OpenAI-compatible HTTP endpoint (``endpoint.py``) with a key of this
episode's own. It returns the episode's reward (a float, given to its last call), or per-call rewards
``{completion_id: reward}``. A plain ``def run`` runs in a worker thread with a blocking client.

Episodes. Each prompt's ``gconfig.n_samples`` episodes form its group. All episodes of a rollout call
run concurrently as coroutines, at most ``rollout.max_concurrent_rollouts`` at a time, and their
requests are sampled together (``engines/batcher.py``). Failures follow the run's failure policy
(``areal_trainer/failures.py``, its ``agent`` kind): an episode that takes longer than
``rollout.agent_timeout`` seconds is cancelled (a plain ``def run``, whose thread cannot be stopped, is
abandoned); one whose agent raises is caught. Either scores ``reward.error_value`` on the calls it made and is
counted (``agent/timeouts``, ``agent/abandoned``, ``agent/errors``); when more than
``reward.max_error_fraction`` of a rollout call's episodes raised or returned an unusable result, the run
stops with the agent's name and one example. Timeouts never stop the run.

Rows. A call's messages become its prompt ids as ``rollout.chat_template_type`` says (``template.py``).
``episodes.py`` turns each prompt's episodes into its group, and ``trajectory.py`` each episode's
recorded calls into rows (``rollout.agent_export``) with discounted per-call rewards
(``rollout.turn_discount``). A group carries its rows episode by episode
with each episode's row count and reward (``TrajectoryGroup.episode_rows``/``episode_rewards``), so
group statistics (GRPO, Dr.GRPO, RLOO, ...) count episodes, not calls. An episode that made no call
has no rows; a group none of whose episodes made a call gets one untrained row (its prompt).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable
from typing import Any

from ...errors import UserError
from ...failures import DEFAULT, FailurePolicy
from ...metrics import Sum
from ..engines.batcher import GenerationBatcher
from ..types import TrajectoryGroup
from .client import AgentClient, SyncAgentClient
from .episodes import EpisodeRows, Outcome
from .images import with_image_urls
from .loop import EpisodeLoop, LoopBlocked, describe
from .processes import AgentProcesses
from .session import EpisodeSession
from .spec import AgentSpec, call_agent, close_method
from .template import CHAT_TEMPLATE_TYPES, Renderer
from .tool_parsers import get_parser

_UNSPELLABLE: set[str] = set()
"""Words already warned about as unknown to the tokenizer (once per process)."""
_REFUSED: set[str] = set()
"""Agents whose refused requests were already warned about (once per process)."""
BATCHING = ("episodes", "eager")
"""``rollout.agent_batching``: when a generation call of the episodes' requests starts (``engines/batcher.py``)."""


class AgentWorkflow:
    """Runs ``rollout.agent`` on every episode of a rollout call (see the module docstring); a
    :class:`~areal_trainer.rollout.types.Workflow`.

    Args:
        engine, tokenizer, reward: as for every workflow.
        agent: the resolved agent (:func:`load_agent`).
        failures: the run's failure policy (``areal_trainer/failures.py``; None: the defaults): how long an
            episode (``agent``) and a tool call (``tool``) may take, what a failed episode scores and the share
            of failed episodes that stops the run.
        timeout: seconds an episode may take, in place of the policy's (None: the policy's).
        export: ``individual`` or ``concat`` (``trajectory.py``).
        chat_template_type: ``hf`` or ``concat``: how a call's messages become prompt ids (``template.py``).
        turn_discount: the per-call discount of later rewards, in (0, 1].
        tool_call_parser: the parser's name or import path.
        max_concurrent: most episodes in flight at once (None: all of a call).
        batching: ``episodes``: a generation call waits until every episode in flight has asked (or
            ended), so the calls do not depend on timing; ``eager``: a call starts whenever the engine is
            free (``engines/batcher.py``).
        batch_wait: with ``episodes``, the most seconds a call waits without news (a request, an episode's
            end) before it samples what is queued (None: no limit).
        max_calls, max_choices: the most calls of one episode, and the largest ``n`` of one request
            (``rollout.agent_max_calls``, ``rollout.agent_max_choices``).
        block_notice: seconds without a beat after which the episodes' loop counts as blocked
            (``loop.py``; at most ``timeout``).
        server: a started ``EndpointServer`` for ``http`` agents (None: started on first use).
        processes: run an ``http`` agent's episodes in this many processes of their own (``processes.py``); 0: on
            the episodes' event loop, in the trainer's process.
        vision: the policy's processor (``model/vision.py``'s ``VisionEncoder``), which renders requests whose
            messages carry images (``image_url`` parts, ``images.py``); None: such requests are refused (400) with
            ``no_images``, which says why (a text-only policy, a backend that samples text only).
    """

    takes_images = True
    """Image prompts reach the agent as ``image_url`` parts of ``data["messages"]``."""
    takes_vision = True
    """The trainer passes ``vision`` and ``no_images`` (``train/sources/build.py``)."""

    def __init__(self, *, engine, tokenizer, reward, agent: AgentSpec, failures: FailurePolicy | None = None,
                 timeout: float | None = None, export: str = "individual", chat_template_type: str = "hf",
                 turn_discount: float = 1.0, tool_call_parser: str = "hermes",
                 max_concurrent: int | None = None, batching: str = "episodes", batch_wait: float | None = 30.0,
                 max_calls: int = 64, max_choices: int = 16, block_notice: float = 10.0, server=None,
                 processes: int = 0, vision: Any = None, no_images: str = "the policy is a text-only model"):
        if batching not in BATCHING:
            raise UserError(f"rollout.agent_batching: got {batching!r}; must be one of {', '.join(BATCHING)}.")
        if chat_template_type not in CHAT_TEMPLATE_TYPES:
            raise UserError(f"rollout.chat_template_type: got {chat_template_type!r}; must be one of "
                            f"{', '.join(CHAT_TEMPLATE_TYPES)}.")
        self.chat_template_type = chat_template_type
        self.engine, self.tokenizer, self.reward, self.agent = engine, tokenizer, reward, agent
        failures = DEFAULT if failures is None else failures
        self.failures = failures if timeout is None else failures.with_timeout("agent", timeout)
        self.timeout, self.max_calls, self.max_choices = self.failures.agent.timeout, max_calls, max_choices
        self.parser = get_parser(tool_call_parser)
        self.max_concurrent, self.batching, self.batch_wait, self.server = max_concurrent, batching, batch_wait, server
        self.vision, self.no_images = vision, no_images
        self.processes = AgentProcesses.of(agent, processes)
        self.instance = agent.target(**agent.kwargs) if agent.is_class and not processes else None
        self.rows = EpisodeRows(tokenizer=tokenizer, agent=agent.path, failures=self.failures,
                                turn_discount=turn_discount, export=export)
        self.block_notice = min(block_notice, self.timeout) if self.timeout is not None else block_notice
        self.batch_calls = 0
        self._loop: EpisodeLoop | None = None
        self._warned_wait = self._warned_block = False

    # -- one rollout call -------------------------------------------------------------------------
    def rollout(self, samples: list[dict], gconfig: Any) -> list[TrajectoryGroup]:
        """One group per sample (``gconfig.n_samples`` episodes each), in order.

        Every rollout call runs on the same event loop, kept until :meth:`close`: what an agent keeps
        between episodes and calls (an ``openai.AsyncOpenAI``, an HTTP session, a database pool) is bound
        to one loop, and would fail on the next call's loop. The loop runs in a thread of its own, watched
        (``loop.py``): one that the agent blocks is counted (``agent/blocked``) and named, and abandoned
        when it stays blocked past ``rollout.agent_timeout``; the call's episodes then end as timeouts."""
        if self._loop is None:
            self._loop = EpisodeLoop()
        blocks: list[str] = []
        abandon = None if self.timeout is None else self.timeout + max(self.block_notice, 2.0)
        try:
            groups = self._loop.run(self._rollout(samples, gconfig), notice_s=self.block_notice, abandon_s=abandon,
                                    on_block=lambda where, seconds: blocks.append(where))
        except LoopBlocked as e:
            # Its thread is the agent's now, with the endpoint it serves; the next call gets a new loop and endpoint
            # (the stall was counted).
            self._loop = self.server = None
            groups = self.rows.lost(samples, gconfig.n_samples, where=e.where, seconds=e.seconds)
        self._notify_blocked(blocks)
        if groups:  # a count of the whole rollout call: on its first group, so that the sum over groups is it
            groups[0].stats["agent/blocked"] = Sum(float(len(blocks)))
        return groups

    def _notify_blocked(self, blocks: list[str]) -> None:
        if blocks and not self._warned_block:
            self._warned_block = True
            _warn(f"rollout.agent {self.agent.path}: the agent blocked the episodes' event loop for more than "
                  f"{self.block_notice:g} s (counted in agent/blocked): an async def agent must not call blocking "
                  "code (time.sleep, a synchronous client); await it (asyncio.sleep, an async client) or "
                  f"make run a plain def, which runs in a thread. It blocks at:\n{blocks[0]}")

    async def _rollout(self, samples: list[dict], gconfig: Any) -> list[TrajectoryGroup]:
        g = gconfig.n_samples
        total = len(samples) * g
        in_flight = min(self.max_concurrent or total, total)
        ended = [0]
        # A generation call waits for every episode in flight (``batching=episodes``): those holding one
        # of the ``in_flight`` slots, which is every episode not ended, up to the number of slots.
        episodes = (lambda: min(in_flight, total - ended[0])) if self.batching == "episodes" else None
        batcher = GenerationBatcher(self.engine, episodes=episodes, max_wait=self.batch_wait)
        limit = asyncio.Semaphore(in_flight)

        def end() -> None:
            ended[0] += 1
            batcher.wake()

        if self.processes is not None:
            await self.processes.begin()
            restarts = self.processes.restarts
        renderer = Renderer(self.tokenizer)  # a prompt's episodes render the same messages: once for the call

        def session(index: int) -> EpisodeSession:
            return EpisodeSession(episode=index, tokenizer=self.tokenizer, batcher=batcher, gconfig=gconfig,
                                  parser=self.parser, max_calls=self.max_calls, max_choices=self.max_choices,
                                  chat_template_type=self.chat_template_type, renderer=renderer,
                                  tool_policy=self.failures.tool, vision=self.vision, no_images=self.no_images)

        rows = [self.data(s) for s in samples]  # once per prompt: an image prompt's pictures are encoded once
        try:
            outcomes = await asyncio.gather(*(self._episode(session(i * g + j), rows[i], limit, end)
                                              for i in range(len(samples)) for j in range(g)))
        finally:
            await batcher.close()
        self.batch_calls += batcher.calls
        self._notify(outcomes, batcher.forced)
        groups = self.rows.groups(samples, outcomes)
        if groups:  # a count of the whole rollout call: on its first group, so that the sum over groups is it
            groups[0].stats["agent/batch_wait_timeouts"] = Sum(float(batcher.forced))
            if self.processes is not None:
                groups[0].stats["agent/process_restarts"] = Sum(float(self.processes.restarts - restarts))
        return groups

    async def _episode(self, session: EpisodeSession, row: dict, limit: asyncio.Semaphore,
                       end: Callable[[], None]) -> Outcome:
        async with limit:
            try:
                return await self._run_episode(session, row)
            finally:
                end()

    async def _run_episode(self, session: EpisodeSession, row: dict) -> Outcome:
        """One episode on its own copy of the prompt's ``row`` (:meth:`data`): an agent may change its messages."""
        server = key = None
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                try:
                    if self.agent.style == "http":
                        server, key = await self._open_key(session)
                    data = {**row, "messages": [dict(m) for m in row["messages"]]}
                    result = await self._call(session, data, server, key)
                    return Outcome(session, "ok", result)
                except Exception as e:  # noqa: BLE001 - the agent's error is contained and counted
                    if deadline.expired():
                        raise
                    return Outcome(session, "error", error=describe(e))
        except TimeoutError:  # a plain def run goes on in its thread: it cannot be stopped
            abandoned = not self.agent.is_async
            return Outcome(session, "timeout", error=f"took longer than {self.failures.agent.timeout_key}="
                           f"{self.timeout:g} s" + ("; its thread is left running" if abandoned else ""),
                           abandoned=abandoned)
        finally:
            session.closed = True
            if key is not None:
                server.close_episode(key)

    @staticmethod
    def data(sample: dict) -> dict:
        """The dataset row an agent gets: every column, and the prompt as chat ``messages`` (an image prompt's
        pictures as ``image_url`` parts with data URLs, in place of its ``{"type": "image"}`` parts)."""
        columns = dict(sample.get("columns") or {})
        if not columns:
            columns = {**sample.get("fields", {}), "prompt": sample.get("prompt"), "answer": sample.get("answer")}
        messages = [dict(m) for m in sample["messages"]]
        images = sample.get("vision")
        if images is not None and images.refs:
            messages = with_image_urls(messages, images.open())
        return {**columns, "messages": messages}

    async def _open_key(self, session: EpisodeSession) -> tuple[Any, str]:
        """The endpoint and the episode's key to it. The endpoint serves on the episodes' loop: the first episode
        starts it, and every episode waits until it listens, so none gets a key to a dead server."""
        from .endpoint import LoopHandler  # the HTTP stack loads only for http agents
        from .loop_endpoint import LoopEndpoint

        if self.server is None:
            self.server = LoopEndpoint()
        server = self.server
        try:
            await server.serving()
        except Exception:
            if self.server is server:  # the next episode tries a new one
                self.server = None
            raise
        return server, server.open_episode(LoopHandler(session, asyncio.get_running_loop()))

    def close(self) -> None:
        """Stop the HTTP endpoint, if one was started, and close the episodes' event loop (the trainer calls
        this when the run ends)."""
        if self.processes is not None:
            self.processes.close()  # first: each closes its agent while the endpoint still answers
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()
        if self._loop is not None:
            loop, self._loop = self._loop, None
            try:
                self._close_instance(loop)
            finally:
                loop.close()

    def _close_instance(self, loop: EpisodeLoop) -> None:
        """Await the agent instance's ``close()`` (or ``aclose()``), if it has one, on the episodes' loop, so
        that what it kept (a client, a session) closes where it was opened; a failure there is only reported."""
        close = close_method(self.instance)
        if close is None:
            return
        try:
            result = close()
            if inspect.isawaitable(result):
                loop.run(asyncio.wait_for(result, 30), notice_s=30, abandon_s=35)
        except Exception as e:  # noqa: BLE001 - the run is ending; the agent's failure must not hide it
            _warn(f"rollout.agent {self.agent.path}: its close() failed: {describe(e)}")

    async def _call(self, session: EpisodeSession, data: dict, server: Any, key: str | None) -> Any:
        if self.agent.style == "http":
            endpoint = dict(base_url=server.base_url, api_key=key)
            if self.processes is not None:
                return await self.processes.run(session.episode, data, endpoint)
            return await call_agent(self.agent, self.instance, data, **endpoint)
        client = (AgentClient(session) if self.agent.is_async
                  else SyncAgentClient(session, asyncio.get_running_loop()))
        return await call_agent(self.agent, self.instance, data, client=client)

    def _notify(self, outcomes: list[Outcome], forced: int) -> None:
        """Warn once about what the counters cannot say: words the tokenizer cannot spell, refused requests,
        generation calls that stopped waiting for the episodes."""
        if forced and not self._warned_wait:
            self._warned_wait = True
            _warn(f"rollout.agent {self.agent.path}: {forced} generation call(s) of this rollout stopped waiting for "
                  f"episodes that sent no request for rollout.agent_batch_wait={self.batch_wait:g} s and sampled the "
                  "requests queued (counted in agent/batch_wait_timeouts): which requests share a call now depends "
                  "on timing, so the run is not reproducible. If the agent's tools take that long, raise "
                  "rollout.agent_batch_wait; if its HTTP client allows fewer connections than it has episodes in "
                  "flight (httpx.Limits), raise the limit or lower rollout.max_concurrent_rollouts.")
        sessions = [o.session for o in outcomes]
        words = set().union(*(s.unknown_words for s in sessions)) - _UNSPELLABLE
        if words:
            _UNSPELLABLE.update(words)
            tools = sorted(words & set().union(*(s.tool_names for s in sessions)))
            shown = (", ".join(map(repr, sorted(words)[:10]))
                     + (f" and {len(words) - 10} more" if len(words) > 10 else ""))
            named = f" (tool names among them: {', '.join(map(repr, tools))})" if tools else ""
            _warn(f"rollout.agent {self.agent.path}: the tokenizer cannot spell {shown}{named} in the agent's "
                          "requests: each reaches the model as the unknown token, the same for every such word, so "
                          "the model can neither read nor write it. Name tools and their arguments with words the "
                          "tokenizer knows (builtin:<size>-tools knows the tool calc and its argument expression), "
                          "or use a pretrained model with its own tokenizer (actor.path).")
        refused = next((s.first_bad_request for s in sessions if s.first_bad_request), None)
        if refused and self.agent.path not in _REFUSED:
            _REFUSED.add(self.agent.path)
            n = sum(s.counters.bad_requests for s in sessions)
            _warn(f"rollout.agent {self.agent.path}: the endpoint refused {n} of the agent's requests in this "
                          f"rollout (counted in agent/bad_requests; nothing of them is sampled or trained); the first: "
                          f"{refused}")


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)

