"""Run reward functions in long-lived worker processes, with a deadline per call.

Nothing a reward function does may hang or kill the trainer: loop forever, raise, call
``os._exit``/``sys.exit``, segfault, or be killed for using too much memory. So each call runs in a
worker process (:mod:`areal_trainer.reward.worker`, a fresh interpreter) and the trainer only waits
on pipes:

* an exception is reported as ``error`` with its text; the worker stays;
* a call that runs past ``timeout`` seconds gets its worker **killed** (its whole process group, so
  a subprocess it started dies too) and replaced; outcome ``timeout``. A thread could not be
  stopped (a C-level computation never releases the interpreter lock), a process always can;
* a worker that dies during a call is replaced; outcome ``died``, with its exit code or signal.

Plain functions run one call at a time per worker, so ``workers`` calls run in parallel.
``async def`` functions run up to ``async_concurrency`` calls at once in each worker's event loop;
the worker cancels a call that overruns (outcome ``timeout``, the others go on). A call that blocks
its worker's loop cannot be cancelled: the worker's watchdog names it, the pool kills the worker
(that call: ``timeout``) and sends the other calls it held to another worker. When the culprit is
unknown (a worker that died holding several async calls, or one so stuck that even its watchdog
did not run and the pool killed it ``KILL_GRACE`` seconds after the deadline), each call it held is
sent once more, and settled as ``died``/``timeout`` if that happens to it a second time.

The dispatcher (:mod:`areal_trainer.reward.dispatch`) runs in the calling thread and waits on all
worker pipes at once (no thread per call), so the overhead per call is one message each way. One
:meth:`WorkerPool.map` runs at a time per pool; :meth:`WorkerPool.amap` runs it in a thread so the
event loop is not blocked. Workers (:mod:`areal_trainer.reward.process`) start on the first call and
import the function before any call's deadline starts.

``workers=0`` runs calls in the calling process, for debugging: exceptions (also ``SystemExit``) are
still caught and async functions get their deadline, but a plain function that hangs hangs the
trainer, and one that crashes the interpreter takes the trainer with it.

:meth:`WorkerPool.close` kills every worker; it also runs when the pool is garbage collected and at
interpreter exit. Workers exit on their own when the trainer dies (EOF on their pipe).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..plugins import import_object
from .dispatch import CallOutcome, Dispatcher
from .functions import is_coroutine_function
from .process import close_all
from .worker import describe


def run_sync(make_coro: Callable[[], Any]) -> Any:
    """Run the coroutine ``make_coro()`` to completion from synchronous code, also when the calling
    thread already runs an event loop (the coroutine then gets its own loop in a helper thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="areal-reward-sync") as ex:
        return ex.submit(lambda: asyncio.run(make_coro())).result()


class WorkerPool:
    """``workers`` worker processes running reward functions given by import path (see module docs)."""

    def __init__(self, workers: int, *, timeout: float | None, name: str = "areal-reward",
                 start_timeout: float = 120.0, async_concurrency: int = 64):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if async_concurrency < 1:
            raise ValueError(f"async_concurrency must be >= 1, got {async_concurrency!r}")
        self.workers, self.timeout, self.name = workers, timeout, name
        self.start_timeout, self.async_concurrency = start_timeout, async_concurrency
        self._dispatcher = Dispatcher(workers, timeout=timeout, name=name, start_timeout=start_timeout,
                                      async_concurrency=async_concurrency)
        self._procs = self._dispatcher.procs
        self._local: dict[str, Callable] = {}
        self._map_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, close_all, self._procs)

    @property
    def restarts(self) -> int:
        """Workers killed (deadline) or found dead, and replaced."""
        return self._dispatcher.restarts

    @property
    def pids(self) -> list[int]:
        """Process ids of the worker processes now running."""
        with self._procs.lock:
            return sorted(p.pid for p in self._procs.live)

    def close(self) -> None:
        """Kill every worker; afterwards no worker process of this pool is alive. Idempotent."""
        self._finalizer()
        if self._map_lock.acquire(blocking=False):  # else the running map cleans up when it sees `closed`
            try:
                self._dispatcher.drop_slots()
            finally:
                self._map_lock.release()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- public calls -------------------------------------------------------------------------

    def map(self, fn_path: str, calls: Sequence[tuple[tuple, dict]]) -> list[CallOutcome]:
        """``fn(*args, **kwargs)`` for each ``(args, kwargs)`` of ``calls``; outcomes in call order."""
        calls = list(calls)
        if not calls:
            return []
        if self.workers == 0:
            fn = self._local_fn(fn_path)
            if isinstance(fn, CallOutcome):
                return [fn] * len(calls)
            if is_coroutine_function(fn):
                return run_sync(lambda: self._amap_local(fn, calls))
            return [_call_local(fn, args, kwargs) for args, kwargs in calls]
        with self._map_lock:
            if self._procs.closed:
                raise RuntimeError(f"the {self.name} worker pool is closed")
            return self._dispatcher.run(fn_path, calls)

    async def amap(self, fn_path: str, calls: Sequence[tuple[tuple, dict]]) -> list[CallOutcome]:
        """:meth:`map` for async code: the event loop is not blocked (except by plain functions with
        ``workers=0``, which run right in it)."""
        calls = list(calls)
        if self.workers > 0 or not calls:
            return await asyncio.to_thread(self.map, fn_path, calls)
        fn = self._local_fn(fn_path)
        if isinstance(fn, CallOutcome):
            return [fn] * len(calls)
        if is_coroutine_function(fn):
            return await self._amap_local(fn, calls)
        return [_call_local(fn, args, kwargs) for args, kwargs in calls]

    # ---- workers=0 ----------------------------------------------------------------------------

    def _local_fn(self, path: str) -> Callable | CallOutcome:
        if path not in self._local:
            try:
                self._local[path] = import_object(path, "reward function")
            except Exception as e:  # noqa: BLE001 - reported per call, as a worker would
                return CallOutcome("error", None, f"cannot load the reward function {path}: {describe(e)}")
        return self._local[path]

    async def _amap_local(self, fn: Callable, calls: list) -> list[CallOutcome]:
        return list(await asyncio.gather(*(self._acall_local(fn, a, k) for a, k in calls)))

    async def _acall_local(self, fn: Callable, args: tuple, kwargs: dict) -> CallOutcome:
        try:
            task = asyncio.ensure_future(fn(*args, **kwargs))
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
            if not done:
                task.cancel()
                return CallOutcome("timeout", None, f"cancelled after {self.timeout} s")
            return CallOutcome("ok", task.result(), "")
        except (Exception, SystemExit) as e:  # noqa: BLE001 - not KeyboardInterrupt: Ctrl-C still stops
            return CallOutcome("error", None, describe(e))


def _call_local(fn: Callable, args: tuple, kwargs: dict) -> CallOutcome:
    try:
        return CallOutcome("ok", fn(*args, **kwargs), "")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - not KeyboardInterrupt: Ctrl-C still stops
        return CallOutcome("error", None, describe(e))
