"""Spreading a map's calls over worker processes, and settling each call's outcome.

:class:`Dispatcher` is what :meth:`~areal_trainer.reward.pool.WorkerPool.map` runs with
``workers >= 1``. It runs in the calling thread and waits on all worker pipes at once (no thread per
call), so the overhead per call is one message each way. Each round it:

1. starts a worker in each empty slot (giving up on the map's calls after ``MAX_START_FAILURES``
   workers in a row failed to start or to import the function);
2. has ready workers import the function first, so a slow import is not charged to a call;
3. sends calls, one per worker per round so async calls spread evenly: a worker takes one call of a
   plain function at a time, up to ``async_concurrency`` of an ``async def`` one;
4. waits for replies until the soonest deadline;
5. kills the workers past a deadline: still starting or importing after ``start_timeout``, or
   holding a call past ``timeout`` (an async one ``KILL_GRACE`` later: its worker cancels it first).

A lost worker (killed, or dead by itself) is replaced in the next round. The call that caused the
loss is settled as ``timeout`` or ``died``; the other calls it held are sent again, each at most
``MAX_ATTEMPTS`` times in all (a call stuck behind one that blocked the event loop is not charged
for that). Starting, talking to and killing one worker process is :mod:`areal_trainer.reward.process`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import pickle
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any, NamedTuple

from .process import Flight, Procs, Worker, await_exit, exit_text, kill
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


class Batch:
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


class Dispatcher:
    """``workers`` slots of worker processes, started when a map needs them and replaced when lost.
    One :meth:`run` at a time (the pool's map lock); ``procs.closed`` stops it."""

    def __init__(self, workers: int, *, timeout: float | None, name: str, start_timeout: float,
                 async_concurrency: int):
        self.workers, self.timeout, self.name = workers, timeout, name
        self.start_timeout, self.async_concurrency = start_timeout, async_concurrency
        self.restarts = 0
        """Workers killed (deadline) or found dead, and replaced."""
        self.procs = Procs()
        self._slots: list[Worker | None] = [None] * workers
        self._kinds: dict[str, bool] = {}  # import path -> is async, as the workers found it
        self._ids = itertools.count()
        self._start_failures, self._start_error = 0, ""

    def run(self, path: str, calls: list) -> list[CallOutcome]:
        """The outcome of ``path(*args, **kwargs)`` for each ``(args, kwargs)`` of ``calls``, in order."""
        self._start_failures = 0
        batch = Batch(path, calls)
        try:
            while batch.left:
                if self.procs.closed:
                    self._abandon(batch, "the worker pool was closed during the call")
                    break
                self._replace_missing(batch)
                self._dispatch(batch)
                if batch.left:
                    self._wait(batch)
                    self._enforce_deadlines(batch)
        finally:
            if self.procs.closed:
                self.drop_slots()
        return batch.out

    def drop_slots(self) -> None:
        """Forget every worker, killing those not reaped yet (the pool is being closed)."""
        for w in self._slots:
            if w is not None:
                w.conn.close()
                if w.proc.returncode is None:
                    kill(w.proc)
        self._slots = [None] * self.workers

    def _replace_missing(self, batch: Batch) -> None:
        if self._start_failures >= MAX_START_FAILURES:
            batch.fail_queued("died", f"the {self.name} worker process failed {self._start_failures} times in a row "
                                      f"before it could take a call: {self._start_error}")
            return
        for k, w in enumerate(self._slots):
            if w is None:
                self._slots[k] = Worker.start(self.procs, self.name, self.start_timeout)

    def _dispatch(self, batch: Batch) -> None:
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

    def _send_call(self, w: Worker, batch: Batch) -> None:
        index, attempt = batch.queue.popleft()
        args, kwargs = batch.calls[index]
        try:
            payload = pickle.dumps((args, kwargs))
        except Exception as e:  # noqa: BLE001 - e.g. a lambda among the row's fields
            batch.finish(index, CallOutcome("error", None, f"cannot send the arguments to a worker: {describe(e)}"))
            return
        call_id = next(self._ids)
        limit = math.inf if self.timeout is None else self.timeout + (KILL_GRACE if self._kinds[batch.path] else 0)
        w.inflight[call_id] = Flight(batch, index, attempt, time.monotonic() + limit)
        self._send(w, ("call", call_id, batch.path, payload, self.timeout))

    def _send(self, w: Worker, msg: tuple) -> None:
        if not w.send(msg):  # it died just now; its death settles or re-sends what it held
            self._lost(w)

    def _wait(self, batch: Batch) -> None:
        live = [w for w in self._slots if w is not None]
        if not live:
            return
        soonest = min(w.soonest_deadline() for w in live)
        timeout = None if soonest == math.inf else max(0.0, soonest - time.monotonic())
        by_conn = {w.conn: w for w in live}
        for conn in wait(list(by_conn), timeout):
            w = by_conn[conn]
            try:
                while w.state != "dead" and w.conn.poll():
                    self._on_message(w, batch, w.conn.recv())
            except (EOFError, OSError):
                self._lost(w)

    def _on_message(self, w: Worker, batch: Batch, msg: tuple) -> None:
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

    def _enforce_deadlines(self, batch: Batch) -> None:
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

    def _blocked(self, w: Worker, call_id: int | None) -> None:
        """``w``'s event loop is stuck in the async call ``call_id``: kill it, and send the calls
        stuck behind it again (without counting that against them when the culprit is known)."""
        detail = f"killed after {self.timeout} s: it blocked the event loop of its worker"
        self._remove(w, detail)
        known = call_id in w.inflight
        self._settle(w, detail, "timeout", {call_id} if known else set(), charge=not known)

    def _lost(self, w: Worker) -> None:
        """``w`` closed its pipe: it died (or is about to); settle or re-send the calls it held."""
        if w.state == "dead":
            return
        await_exit(w.proc, 0.5)
        starting = w.state != "ready"
        detail = exit_text(self._remove(w, None))
        if self.procs.closed:
            return
        if starting:
            self._start_failures += 1
            self._start_error = detail
        self._settle(w, detail, "died", set(w.inflight) if len(w.inflight) == 1 else set())

    def _settle(self, w: Worker, detail: str, status: str, culprits: set[int], charge: bool = True) -> None:
        """The calls ``w`` held when it was lost: ``culprits`` (and, when ``charge``, calls already
        sent ``MAX_ATTEMPTS`` times) get ``status``; the others go back to the queue."""
        for cid, f in w.inflight.items():
            if cid in culprits or (charge and f.attempt + 1 >= MAX_ATTEMPTS):
                why = detail if cid in culprits else f"{detail}, while it also ran other calls"
                f.batch.finish(f.index, CallOutcome(status, None, why))
            else:
                f.batch.queue.append((f.index, f.attempt + charge))
        w.inflight.clear()

    def _remove(self, w: Worker, reason: str | None) -> int:
        """Kill and reap ``w``, free its slot; its return code."""
        returncode = w.stop(self.procs)
        self._slots = [None if s is w else s for s in self._slots]
        if not self.procs.closed:
            self.restarts += 1
            if self.restarts == 1 or self.restarts % WARN_EVERY == 0:
                logger.warning("%s: worker %d %s; replaced (%d replaced so far)", self.name, w.proc.pid,
                               reason or exit_text(returncode), self.restarts)
        return returncode

    def _abandon(self, batch: Batch, detail: str) -> None:
        """The pool was closed while ``batch`` ran: every call without an outcome gets ``died``."""
        for w in self._slots:
            if w is not None:
                w.inflight.clear()
        batch.queue.clear()
        for index, outcome in enumerate(batch.out):
            if outcome is None:
                batch.finish(index, CallOutcome("died", None, detail))
