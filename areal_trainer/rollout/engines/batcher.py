"""Dynamic batching of generation requests from concurrent episodes.

Agent episodes run as coroutines on one event loop and each asks for one completion at a time.
The engines are fastest when they sample many rows in one call, so requests are not generated one by
one: :class:`GenerationBatcher` queues them, and whenever the engine is free it takes every queued
request with the same sampling settings and generates them in one ``engine.generate`` call, run in a
worker thread so the loop (and the tools of other episodes) keeps running meanwhile. Requests that
arrive while a call runs form the next call.

When a call starts. With ``episodes`` (the agent workflow's episodes in flight, a callable giving how
many of them may still ask), a call waits until every one of those episodes has a request queued (or
has ended): each call then holds exactly the requests of the episodes in flight, however long their
tools, their processes or their HTTP requests took to get there, and whatever the threads' timing.
Without ``episodes`` a call starts as soon as the engine is free and a request is queued ("eager":
requests that arrive while a call runs form the next one). Either way, before taking a batch the
batcher lets the loop run until no coroutine is ready (``_settle``), so that requests an episode
sends together (``asyncio.gather`` of several calls) join the same call.

Waiting has a limit, ``max_wait``: when no request arrives and no episode ends for that many seconds, a
call samples the requests queued so far (``forced``). This bounds what an episode that is slow to ask
costs the others (a tool that takes minutes), and it ends a standstill that waiting alone cannot: an
agent whose HTTP client allows fewer connections than it has episodes in flight holds the remaining
requests back until some are answered. Such calls depend on timing again.

Order. A call's rows are the queued requests sorted by ``order`` (the episode's index, its call
number, the choice), not by arrival; requests of other sampling settings wait for the next call, the
one of the lowest ``order`` choosing the settings first. Waiting for every episode plus this order
make the calls, and so a seeded run's random draws, the same from run to run, for agents in process
and over HTTP alike (the lagged mode's reproducibility rests on this). Eager calls depend on timing.

Cancellation. A request whose episode is cancelled (a timeout) is dropped from the queue; one
already being generated finishes with its call and its result is discarded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..types import Generation


@dataclass(order=True)
class _Request:
    order: tuple
    prompt: list[int] = field(compare=False)
    gconfig: Any = field(compare=False)
    future: asyncio.Future = field(compare=False)
    vision: Any = field(default=None, compare=False)


def _settings_key(gconfig: Any) -> tuple:
    """Requests generated together must share every sampling setting but the prompt."""
    return tuple(sorted((k, repr(v)) for k, v in vars(gconfig).items()))


class GenerationBatcher:
    """Queues ``generate`` requests of concurrent coroutines and runs them in batched engine calls.

    Args:
        engine: an ``InferenceEngine`` (``generate(prompts, gconfig) -> list[Generation]``).
        max_batch: most rows per engine call (None: all queued requests).
        episodes: how many episodes may still send a request (None: eager calls; see the module
            docstring). Call :meth:`wake` when that number drops.
        max_wait: when waiting for episodes, the most seconds without a new request or an episode's end
            before a call samples the requests queued anyway (None: no limit; see the module docstring).
    """

    def __init__(self, engine, max_batch: int | None = None, episodes: Callable[[], int] | None = None,
                 max_wait: float | None = None):
        self.engine, self.max_batch, self.episodes, self.max_wait = engine, max_batch, episodes, max_wait
        self.forced = 0
        """Calls started after ``max_wait`` seconds without news, before every episode in flight had asked."""
        self._queue: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.calls = 0
        """Engine calls made (each batches every request queued at its start)."""
        self.rows = 0
        """Rows generated in all."""

    async def generate(self, prompt: list[int], gconfig: Any, order: tuple, vision: Any = None) -> Generation:
        """One answer to ``prompt`` sampled with ``gconfig``; ``order`` places it within its call; ``vision``: the
        prompt's processed images (an engine that samples image prompts, ``EngineSpec.takes_images``)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._serve(), name="areal-generation-batcher")
        request = _Request(order, list(prompt), gconfig, loop.create_future(), vision)
        self._queue.append(request)
        self._wake.set()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            if request in self._queue:
                self._queue.remove(request)
            raise

    def wake(self) -> None:
        """Look at the queue again (an episode ended, so a call may no longer wait for it)."""
        if self._wake is not None:
            self._wake.set()

    def _ready(self) -> bool:
        """Whether a call may start: a request is queued and, when waiting for episodes, every
        episode that may still ask has a request queued."""
        if not self._queue:
            return False
        if self.episodes is None:
            return True
        return len({r.order[0] for r in self._queue}) >= self.episodes()

    async def close(self) -> None:
        """Stop serving (requests still queued fail with ``CancelledError``)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the loop is ending
                pass
        for r in self._queue:
            if not r.future.done():
                r.future.cancel()
        self._queue.clear()

    @staticmethod
    async def _settle(rounds: int = 8) -> None:
        """Let every ready coroutine run until it blocks (a few loop iterations)."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def _serve(self) -> None:
        while True:
            waited = await self._wait_for_news()
            await self._settle()
            forced = waited and self._queue and not self._ready()
            if forced:  # episodes in flight sent nothing for max_wait seconds: sample what is queued
                self.forced += 1
            while self._ready() or forced:
                forced = False
                batch = self._take()
                images = {"vision": [r.vision for r in batch]} if any(r.vision is not None for r in batch) else {}
                try:
                    gens = await asyncio.to_thread(self.engine.generate, [r.prompt for r in batch], batch[0].gconfig,
                                                   **images)
                except BaseException as e:  # noqa: BLE001 - every waiting episode gets the error
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(e)
                    if isinstance(e, asyncio.CancelledError):
                        raise
                    continue
                self.calls += 1
                self.rows += len(batch)
                for r, g in zip(batch, gens):
                    if not r.future.done():
                        r.future.set_result(g)
                await self._settle()

    async def _wait_for_news(self) -> bool:
        """Wait for a new request or an episode's end; True when ``max_wait`` ran out first while requests
        were queued (a call waiting for episodes only: an eager one never waits with requests queued)."""
        timeout = self.max_wait if self._queue and self.episodes is not None else None
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            return True
        self._wake.clear()
        return False

    def _take(self) -> list[_Request]:
        """The queued requests of the lowest-ordered request's settings, in ``order`` (at most ``max_batch``)."""
        key = _settings_key(min(self._queue).gconfig)
        same = sorted(r for r in self._queue if _settings_key(r.gconfig) == key)
        batch = same[: self.max_batch] if self.max_batch else same
        taken = {id(r) for r in batch}
        self._queue = [r for r in self._queue if id(r) not in taken]
        return batch
