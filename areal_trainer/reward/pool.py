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

The dispatcher runs in the calling thread and waits on all worker pipes at once (no thread per
call), so the overhead per call is one message each way. One :meth:`WorkerPool.map` runs at a time
per pool; :meth:`WorkerPool.amap` runs it in a thread so the event loop is not blocked. Workers start
on the first call and import the function before any call's deadline starts.

``workers=0`` runs calls in the calling process, for debugging: exceptions (also ``SystemExit``) are
still caught and async functions get their deadline, but a plain function that hangs hangs the
trainer, and one that crashes the interpreter takes the trainer with it.

:meth:`WorkerPool.close` kills every worker; it also runs when the pool is garbage collected and at
interpreter exit. Workers exit on their own when the trainer dies (EOF on their pipe).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Pipe, wait
from typing import Any, NamedTuple

from ..plugins import import_object
from .functions import is_coroutine_function
from .worker import describe

logger = logging.getLogger(__name__)

KILL_GRACE = 1.0
"""Seconds past the deadline before a worker running async calls is killed (it cancels them itself first)."""
MAX_START_FAILURES = 3
"""Workers that fail to start (or to import the function) in a row before a map gives up on its calls."""
MAX_ATTEMPTS = 2
"""Times a call is sent when its worker is lost while it was one of several calls in flight there."""
WARN_EVERY = 100
"""Log a warning on the first worker kill or death and then on every WARN_EVERY-th."""


class CallOutcome(NamedTuple):
    status: str
    """``"ok"``, ``"error"``, ``"timeout"`` or ``"died"``."""
    value: Any
    """The function's return value when ``ok``, else None."""
    detail: str
    """What went wrong: ``"ValueError: ..."``, ``"killed after 5.0 s"``, ``"worker process died (exit code 1)"``."""


def exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"worker process died (signal {-returncode}, {name})"
    return f"worker process died (exit code {returncode})"


def run_sync(make_coro: Callable[[], Any]) -> Any:
    """Run the coroutine ``make_coro()`` to completion from synchronous code, also when the calling
    thread already runs an event loop (the coroutine then gets its own loop in a helper thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="areal-reward-sync") as ex:
        return ex.submit(lambda: asyncio.run(make_coro())).result()


class _Procs:
    """Every live worker process of one pool; shared with the finalizer, which must not hold the pool."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live: set[subprocess.Popen] = set()
        self.closed = False


def _kill(proc: subprocess.Popen) -> int:
    """SIGKILL the worker's process group (its subprocesses too) and reap it; its return code."""
    if proc.returncode is not None:  # reaped already: its id may belong to another process by now
        return proc.returncode
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group outlives a zombie leader: its id is not reused
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        return proc.wait(10)
    except subprocess.TimeoutExpired:  # pragma: no cover - e.g. stuck in uninterruptible I/O
        logger.warning("reward worker %d did not exit 10 s after SIGKILL", proc.pid)
        return -signal.SIGKILL


def _close_all(procs: _Procs) -> None:
    with procs.lock:
        procs.closed = True
        live, procs.live = list(procs.live), set()
    for proc in live:
        _kill(proc)


def _await_exit(proc: subprocess.Popen, seconds: float) -> None:
    """Wait (without reaping) until ``proc`` has exited, at most ``seconds``: after EOF on its pipe the
    exit status is then its own, not the SIGKILL that :func:`_kill` sends to clean up its group."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return
        except ChildProcessError:
            return
        time.sleep(0.002)


class _Flight:
    __slots__ = ("batch", "index", "attempt", "deadline")

    def __init__(self, batch, index: int, attempt: int, deadline: float):
        self.batch, self.index, self.attempt, self.deadline = batch, index, attempt, deadline


class _Worker:
    """The trainer's handle on one worker process: ``starting`` -> ``ready`` <-> ``loading``."""

    def __init__(self, proc: subprocess.Popen, conn, deadline: float):
        self.proc, self.conn = proc, conn
        self.state, self.deadline = "starting", deadline
        self.loaded: set[str] = set()
        self.loading = ""  # the import path being loaded, in state "loading"
        self.inflight: dict[int, _Flight] = {}


class _Batch:
    """The calls of one map: a queue of ``(index, attempt)`` still to send and the outcomes so far."""

    def __init__(self, path: str, calls: Sequence[tuple[tuple, dict]]):
        self.path, self.calls = path, calls
        self.out: list[CallOutcome | None] = [None] * len(calls)
        self.queue = collections.deque((i, 0) for i in range(len(calls)))
        self.left = len(calls)

    def finish(self, index: int, outcome: CallOutcome) -> None:
        if self.out[index] is None:
            self.out[index] = outcome
            self.left -= 1

    def fail_queued(self, status: str, detail: str) -> None:
        while self.queue:
            self.finish(self.queue.popleft()[0], CallOutcome(status, None, detail))


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
        self.restarts = 0
        """Workers killed (deadline) or found dead, and replaced."""
        self._slots: list[_Worker | None] = [None] * workers
        self._kinds: dict[str, bool] = {}  # import path -> is async, as the workers found it
        self._local: dict[str, Callable] = {}
        self._map_lock = threading.Lock()
        self._procs = _Procs()
        self._ids = itertools.count()
        self._start_failures, self._start_error = 0, ""
        self._finalizer = weakref.finalize(self, _close_all, self._procs)

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
                self._drop_slots()
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
            self._start_failures = 0
            return self._map_workers(fn_path, calls)

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

    # ---- workers >= 1 -------------------------------------------------------------------------

    def _map_workers(self, path: str, calls: list) -> list[CallOutcome]:
        batch = _Batch(path, calls)
        try:
            while batch.left:
                if self._procs.closed:
                    self._abandon(batch, "the worker pool was closed during the call")
                    break
                self._replace_missing(batch)
                self._dispatch(batch)
                if batch.left:
                    self._wait(batch)
                    self._enforce_deadlines(batch)
        finally:
            if self._procs.closed:
                self._drop_slots()
        return batch.out

    def _spawn(self) -> _Worker:
        parent, child = Pipe()
        # The worker sees this import path, so functions of the caller's own modules resolve.
        paths = [p or os.getcwd() for p in sys.path]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        cmd = [sys.executable, "-m", "areal_trainer.reward.worker", str(child.fileno())]
        with self._procs.lock:  # close() must not miss a worker started while it runs
            if self._procs.closed:
                parent.close()
                child.close()
                raise RuntimeError(f"the {self.name} worker pool is closed")
            # A session of its own: a kill reaches the worker's subprocesses, and Ctrl-C in the
            # terminal does not (the trainer decides when workers stop).
            proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
            self._procs.live.add(proc)
        child.close()
        return _Worker(proc, parent, time.monotonic() + self.start_timeout)

    def _replace_missing(self, batch: _Batch) -> None:
        if self._start_failures >= MAX_START_FAILURES:
            batch.fail_queued("died", f"the {self.name} worker process failed {self._start_failures} times in a row "
                                      f"before it could take a call: {self._start_error}")
            return
        for k, w in enumerate(self._slots):
            if w is None:
                self._slots[k] = self._spawn()

    def _dispatch(self, batch: _Batch) -> None:
        for w in self._slots:
            if w is not None and w.state == "ready" and batch.path not in w.loaded and batch.queue:
                self._send(w, ("load", batch.path))
                if w.state == "ready":
                    w.state, w.deadline = "loading", time.monotonic() + self.start_timeout
                    w.loading = batch.path
        if not batch.queue or batch.path not in self._kinds:
            return
        cap = self.async_concurrency if self._kinds[batch.path] else 1
        ready = [w for w in self._slots if w is not None and w.state == "ready" and batch.path in w.loaded]
        while batch.queue and ready:  # one call per worker per round: even spread of async calls
            ready = [w for w in ready if w.state == "ready" and len(w.inflight) < cap]
            for w in ready:
                if batch.queue:
                    self._send_call(w, batch)

    def _send_call(self, w: _Worker, batch: _Batch) -> None:
        index, attempt = batch.queue.popleft()
        args, kwargs = batch.calls[index]
        try:
            payload = pickle.dumps((args, kwargs))
        except Exception as e:  # noqa: BLE001 - e.g. a lambda among the row's fields
            batch.finish(index, CallOutcome("error", None, f"cannot send the arguments to a worker: {describe(e)}"))
            return
        call_id = next(self._ids)
        limit = math.inf if self.timeout is None else self.timeout + (KILL_GRACE if self._kinds[batch.path] else 0)
        w.inflight[call_id] = _Flight(batch, index, attempt, time.monotonic() + limit)
        self._send(w, ("call", call_id, batch.path, payload, self.timeout))

    def _send(self, w: _Worker, msg: tuple) -> None:
        try:
            w.conn.send(msg)
        except OSError:  # it died just now; its death settles or re-sends what it held
            self._lost(w)

    def _wait(self, batch: _Batch) -> None:
        live = [w for w in self._slots if w is not None]
        if not live:
            return
        deadlines = [w.deadline for w in live if w.state != "ready"]
        deadlines += [f.deadline for w in live for f in w.inflight.values()]
        soonest = min(deadlines, default=math.inf)
        timeout = None if soonest == math.inf else max(0.0, soonest - time.monotonic())
        by_conn = {w.conn: w for w in live}
        for conn in wait(list(by_conn), timeout):
            w = by_conn[conn]
            try:
                while w.state != "dead" and w.conn.poll():
                    self._on_message(w, batch, w.conn.recv())
            except (EOFError, OSError):
                self._lost(w)

    def _on_message(self, w: _Worker, batch: _Batch, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            w.state, w.deadline = "ready", math.inf
        elif kind == "loaded":
            w.loaded.add(msg[1])
            self._kinds[msg[1]] = msg[2]
            w.state, w.deadline = "ready", math.inf
            self._start_failures = 0
        elif kind == "blocked":
            self._blocked(w, msg[1])
        elif kind == "load_error":
            w.state, w.deadline = "ready", math.inf
            if msg[1] == batch.path:
                batch.fail_queued("error", f"cannot load the reward function {msg[1]}: {msg[2]}")
        else:
            flight = w.inflight.pop(msg[1], None)
            if flight is None:
                return  # the late reply of a call already settled
            outcome = CallOutcome(kind, None, msg[2])
            if kind == "ok":
                try:
                    outcome = CallOutcome("ok", pickle.loads(msg[2]), "")
                except Exception as e:  # noqa: BLE001 - e.g. a result class the trainer cannot import
                    outcome = CallOutcome("error", None, f"cannot read the result sent back: {describe(e)}")
            flight.batch.finish(flight.index, outcome)

    def _enforce_deadlines(self, batch: _Batch) -> None:
        now = time.monotonic()
        for w in self._slots:
            if w is None:
                continue
            if w.state != "ready" and w.deadline <= now:
                what = "start" if w.state == "starting" else f"import {w.loading}"
                self._remove(w, f"killed: it did not {what} within {self.start_timeout} s")
                self._start_failures += 1
                self._start_error = f"it did not {what} within {self.start_timeout} s"
                continue
            expired = {cid for cid, f in w.inflight.items() if f.deadline <= now}
            if expired:
                detail = f"killed after {self.timeout} s"
                self._remove(w, detail)
                self._settle(w, detail, "timeout", expired)

    def _blocked(self, w: _Worker, call_id: int | None) -> None:
        """``w``'s event loop is stuck in the async call ``call_id``: kill it, and send the calls
        stuck behind it again (without counting that against them when the culprit is known)."""
        detail = f"killed after {self.timeout} s: it blocked the event loop of its worker"
        self._remove(w, detail)
        known = call_id in w.inflight
        self._settle(w, detail, "timeout", {call_id} if known else set(), charge=not known)

    def _lost(self, w: _Worker) -> None:
        """``w`` closed its pipe: it died (or is about to); settle or re-send the calls it held."""
        if w.state == "dead":
            return
        _await_exit(w.proc, 0.5)
        starting = w.state != "ready"
        detail = exit_text(self._remove(w, None))
        if self._procs.closed:
            return
        if starting:
            self._start_failures += 1
            self._start_error = detail
        self._settle(w, detail, "died", set(w.inflight) if len(w.inflight) == 1 else set())

    def _settle(self, w: _Worker, detail: str, status: str, culprits: set[int], charge: bool = True) -> None:
        """The calls ``w`` held when it was lost: ``culprits`` (and, when ``charge``, calls already
        sent ``MAX_ATTEMPTS`` times) get ``status``; the others go back to the queue."""
        for cid, f in w.inflight.items():
            if cid in culprits or (charge and f.attempt + 1 >= MAX_ATTEMPTS):
                why = detail if cid in culprits else f"{detail}, while it also ran other calls"
                f.batch.finish(f.index, CallOutcome(status, None, why))
            else:
                f.batch.queue.append((f.index, f.attempt + charge))
        w.inflight.clear()

    def _remove(self, w: _Worker, reason: str | None) -> int:
        """Kill and reap ``w``, free its slot; its return code."""
        w.state = "dead"
        with self._procs.lock:
            self._procs.live.discard(w.proc)
        returncode = _kill(w.proc)
        w.conn.close()
        self._slots = [None if s is w else s for s in self._slots]
        if not self._procs.closed:
            self.restarts += 1
            if self.restarts == 1 or self.restarts % WARN_EVERY == 0:
                logger.warning("%s: worker %d %s; replaced (%d replaced so far)", self.name, w.proc.pid,
                               reason or exit_text(returncode), self.restarts)
        return returncode

    def _abandon(self, batch: _Batch, detail: str) -> None:
        """The pool was closed while ``batch`` ran: every call without an outcome gets ``died``."""
        for w in self._slots:
            if w is not None:
                w.inflight.clear()
        batch.queue.clear()
        for index, outcome in enumerate(batch.out):
            if outcome is None:
                batch.finish(index, CallOutcome("died", None, detail))

    def _drop_slots(self) -> None:
        for w in self._slots:
            if w is not None:
                w.conn.close()
                if w.proc.returncode is None:
                    _kill(w.proc)
        self._slots = [None] * self.workers


def _call_local(fn: Callable, args: tuple, kwargs: dict) -> CallOutcome:
    try:
        return CallOutcome("ok", fn(*args, **kwargs), "")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - not KeyboardInterrupt: Ctrl-C still stops
        return CallOutcome("error", None, describe(e))
