"""The event loop agents run on: a thread of its own, watched, so that an agent that blocks it cannot hang
the run.

An ``async def`` agent that calls something blocking (``time.sleep``, a synchronous HTTP client, a long
computation) stops every episode of the loop, the generation batcher and ``asyncio.timeout`` with it: no
timeout can fire on a loop that does not run. So the loop runs in its own thread and beats every
``BEAT_S``; the caller waits for a rollout call in short slices and looks at the beat. A loop that missed
its beat for ``notice_s`` is *blocked*: it is counted and the agent's frame that holds it is named (a
loop that then goes on was blocked for a while: its episodes past ``rollout.agent_timeout`` end as
timeouts once it runs again). A loop still blocked after ``abandon_s`` is abandoned (:class:`LoopBlocked`):
its thread is left to the agent (a thread cannot be stopped; it is a daemon), and the next rollout call
gets a new loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

BEAT_S = 0.2
"""How often the loop shows it runs."""
_SKIP = (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
         os.path.dirname(asyncio.__file__) + os.sep, threading.__file__)
"""The frames that never say what blocks the loop: this package's, asyncio's and the thread's start."""


def describe(e: BaseException) -> str:
    """An exception with the agent's frames of its traceback (the trainer's own frames left out); one raised in an
    agent process (``processes.py``) is that process's description of it."""
    remote = getattr(e, "description", None)
    if isinstance(remote, str):
        return remote
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(_SKIP[0])][-4:]
    where = "".join(traceback.format_list(frames))
    return f"{where}{type(e).__name__}: {e}".strip()


class LoopBlocked(Exception):
    """The episodes' loop stayed blocked past its limit; ``where`` is the code that holds it."""

    def __init__(self, where: str, seconds: float):
        super().__init__(f"blocked for {seconds:.0f} s at\n{where}")
        self.where, self.seconds = where, seconds


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each call in a daemon thread, and never waits for them at shutdown.

    Plain ``def`` agents, sync tools and engine calls run in worker threads. A thread cannot be
    stopped, so one that never returns (an agent past its timeout, a hung tool) is abandoned: the
    standard executor would make the end of every rollout call, and the process's exit, wait for it.
    A worker that finishes waits ``IDLE_S`` for the next call before it ends, so the many short calls of
    a rollout (the ``openai`` client runs one per new client copy) reuse threads instead of starting
    one each; a call that finds no idle worker starts a new one, so a hung call never delays another.
    (A ``ThreadPoolExecutor`` only because asyncio accepts no other default executor; its pool is unused.)
    """

    IDLE_S = 30.0

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._idle_lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._idle_lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # this call is that idle worker's
        self._work.put((future, fn, args, kwargs))
        if start:
            threading.Thread(target=self._worker, name="areal-agent-worker", daemon=True).start()
        return future

    def _worker(self) -> None:
        while True:
            try:
                future, fn, args, kwargs = self._work.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._idle_lock:
                    if self._idle > 0:
                        self._idle -= 1
                        return
                continue  # a call was handed to this worker as it timed out: take it
            result = error = None
            running = future.set_running_or_notify_cancel()
            if running:
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 - handed to whoever awaits the future
                    error = e
            with self._idle_lock:  # idle before the caller learns the result: its next call finds this worker
                self._idle += 1
            if running:
                future.set_exception(error) if error is not None else future.set_result(result)
            del future, fn, args, kwargs, result, error

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to wait for: the threads are daemons, and an idle one ends by itself."""


class EpisodeLoop:
    """An event loop running in a daemon thread of its own, beating every ``BEAT_S`` (see the module)."""

    def __init__(self, name: str = "areal-agent-loop"):
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(DaemonExecutor())
        self.beat = time.monotonic()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._beat)
        self.loop.run_forever()

    def _beat(self) -> None:
        self.beat = time.monotonic()
        self.loop.call_later(BEAT_S, self._beat)

    def stalled(self) -> float:
        """Seconds since the loop last ran its beat."""
        return time.monotonic() - self.beat

    def where(self) -> str:
        """The innermost frames of the loop's thread outside this package and asyncio: what blocks it."""
        frame = sys._current_frames().get(self.thread.ident)
        if frame is None:
            return "(the loop's thread has ended)"
        frames = [f for f in traceback.extract_stack(frame) if not f.filename.startswith(_SKIP)][-3:]
        return "".join(traceback.format_list(frames)).rstrip() or "(inside the trainer's own code)"

    def run(self, coro: Coroutine, *, notice_s: float, abandon_s: float | None,
            on_block: Callable[[str, float], None] = lambda where, seconds: None) -> Any:
        """``coro``'s result, run on the loop. ``on_block(where, seconds)`` once per stretch in which the loop
        misses its beat for ``notice_s``; :class:`LoopBlocked` when one lasts ``abandon_s`` (None: never)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        noticed = False
        while True:
            try:
                return future.result(timeout=BEAT_S)
            except concurrent.futures.TimeoutError:
                pass
            stall = self.stalled()
            if stall < 2 * BEAT_S:
                noticed = False  # it runs again: a later stall is another one
            elif stall >= notice_s and not noticed:
                noticed = True
                on_block(self.where(), stall)
            if abandon_s is not None and stall >= abandon_s:
                raise LoopBlocked(self.where(), stall)

    def close(self, timeout: float = 30.0) -> bool:
        """Cancel what still runs on the loop, stop it and close it; False when the loop is blocked (then its
        thread is left as it is)."""
        if self.stalled() > max(timeout, 5.0):
            return False
        try:
            self.run(_cancel_the_rest(), notice_s=timeout, abandon_s=timeout)
        except LoopBlocked:
            return False
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        if self.thread.is_alive():
            return False
        self.loop.close()
        return True


async def _cancel_the_rest() -> None:
    """Cancel every other task of the running loop, and finish its async generators."""
    loop = asyncio.get_running_loop()
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await loop.shutdown_asyncgens()
