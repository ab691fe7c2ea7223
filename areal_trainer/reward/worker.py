"""The main of one reward worker process: ``python -m areal_trainer.reward.worker <fd>``.

:class:`~areal_trainer.reward.pool.WorkerPool` starts this module in a fresh interpreter (never a
``fork`` of the trainer, whose torch threads would be copied in an undefined state, and never
``multiprocessing``'s ``spawn``, which re-imports the caller's ``__main__`` script). ``<fd>`` is
this process's end of a socket pair, read and written with ``multiprocessing.connection``.

Protocol (tuples; arguments and results travel as pickled bytes inside them, so that a value that
cannot be unpickled on the other side is reported for its own call instead of breaking the stream):

* worker -> pool: ``("ready", pid)`` once started.
* pool -> worker: ``("load", path)``; reply ``("loaded", path, is_async)`` or
  ``("load_error", path, text)``. Importing happens here, before any call's deadline starts, so a
  slow import (torch, sympy) is not mistaken for a hung call.
* pool -> worker: ``("call", id, path, payload, timeout)`` with ``payload = pickle((args, kwargs))``;
  reply ``("ok", id, pickle(value))``, ``("error", id, text)`` or ``("timeout", id, text)``.
* worker -> pool: ``("blocked", id)``: the async call ``id`` (None: unknown) blocks the event loop.

Threads: a reader thread receives messages. Plain functions run one at a time in the main thread
(the pool sends a worker one plain call at a time, and ``signal.alarm``-based limits in user code
only work there). ``async def`` functions run as tasks of an event loop in a second thread, many at
once; each task is cancelled after ``timeout`` seconds and reported as ``timeout`` while the others
go on. A task that blocks the loop (``time.sleep``, a long computation) cannot be cancelled: a
watchdog thread notices the missed deadline, finds the task the loop is stuck in and reports it,
and the pool kills the process (or, when even the watchdog cannot run, after its own later deadline).

The worker ends itself when the trainer closes its end of the pipe or dies (the reader thread sees
EOF and calls ``os._exit``, even while the main thread is stuck in a call). It ignores SIGINT:
Ctrl-C is the trainer's to handle, and the trainer stops its workers.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from ..plugins import import_object
from .functions import is_coroutine_function

WATCH_EVERY = 0.05
"""Seconds between the watchdog's looks at the async calls' deadlines."""
BLOCKED_AFTER = 0.25
"""Seconds past a deadline after which an uncancelled async call means a blocked event loop."""
MAX_TEXT = 500
"""Characters of an exception message sent back to the trainer."""
_HERE = os.path.dirname(os.path.abspath(__file__))
_OWN_FILES = {os.path.join(_HERE, "worker.py"), os.path.join(_HERE, "pool.py")}
"""Frames of these files are left out of error locations: they are the machinery, not the reward."""


def describe(e: BaseException) -> str:
    """``"ValueError: message (file.py:12, in fn)"``: the exception and where it was raised."""
    text = f"{type(e).__name__}: {e}"
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "..."
    frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) not in _OWN_FILES]
    if frames:  # the innermost frame of the user's code (none for a builtin called directly)
        last = frames[-1]
        text += f" ({os.path.basename(last.filename)}:{last.lineno}, in {last.name})"
    return text


class _Server:
    """The worker side of the protocol in the module docs."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.send_lock = threading.Lock()
        self.fns: dict[str, tuple] = {}
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set = set()  # strong references: the loop keeps only weak ones
        self.watched: dict[int, tuple] = {}  # async call id -> (its task, deadline), for the watchdog
        self.watch_lock = threading.Lock()

    def serve(self) -> None:
        self.send(("ready", os.getpid()))
        threading.Thread(target=self._read, name="areal-reward-reader", daemon=True).start()
        while True:
            msg = self.jobs.get()
            if msg[0] == "load":
                self._load(msg[1])
            else:
                self._call(*msg[1:])

    def send(self, msg: tuple) -> None:
        try:
            with self.send_lock:
                self.conn.send(msg)
        except OSError:  # the trainer is gone
            os._exit(0)

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):  # the trainer closed the pipe or died: nothing left to do
                os._exit(0)
            fn = self.fns.get(msg[2]) if msg[0] == "call" else None
            if fn is not None and fn[1]:  # async: straight to the loop, not behind a busy main thread
                self.loop.call_soon_threadsafe(self._start_task, *msg[1:])
            else:
                self.jobs.put(msg)

    def _get(self, path: str) -> tuple:
        if path not in self.fns:
            fn = import_object(path, "reward function")
            if not callable(fn):
                raise TypeError(f"{path} is a {type(fn).__name__}, not a callable")
            is_async = is_coroutine_function(fn)
            if is_async and self.loop is None:
                self.loop = asyncio.new_event_loop()
                threading.Thread(target=self.loop.run_forever, name="areal-reward-loop", daemon=True).start()
                threading.Thread(target=self._watch, name="areal-reward-watchdog", daemon=True).start()
            self.fns[path] = (fn, is_async)
        return self.fns[path]

    def _load(self, path: str) -> None:
        try:
            _, is_async = self._get(path)
        except BaseException as e:  # noqa: BLE001 - reported to the trainer as text
            self.send(("load_error", path, describe(e)))
            return
        self.send(("loaded", path, is_async))

    def _reply(self, call_id: int, value) -> None:
        try:
            data = pickle.dumps(value)
        except Exception as e:  # noqa: BLE001 - e.g. a generator or a lock
            self.send(("error", call_id, f"cannot send the result back to the trainer: {describe(e)}"))
            return
        self.send(("ok", call_id, data))

    def _call(self, call_id: int, path: str, payload: bytes, timeout: float | None) -> None:
        try:
            fn, is_async = self._get(path)
            if is_async:
                self.loop.call_soon_threadsafe(self._start_task, call_id, path, payload, timeout)
                return
            args, kwargs = pickle.loads(payload)
            value = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
            self.send(("error", call_id, describe(e)))
            return
        self._reply(call_id, value)

    def _start_task(self, call_id: int, path: str, payload: bytes, timeout: float | None) -> None:
        task = self.loop.create_task(self._run_async(call_id, self.fns[path][0], payload, timeout))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_async(self, call_id: int, fn, payload: bytes, timeout: float | None) -> None:
        try:
            args, kwargs = pickle.loads(payload)
            inner = asyncio.ensure_future(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001
            self.send(("error", call_id, describe(e)))
            return
        if timeout is not None:
            with self.watch_lock:
                self.watched[call_id] = (inner, time.monotonic() + timeout)
        try:
            done, _ = await asyncio.wait({inner}, timeout=timeout)
        finally:
            with self.watch_lock:
                self.watched.pop(call_id, None)
        if not done:
            # Not awaited after cancel(): a coroutine that swallows the cancellation must not hold up
            # the reply. It goes on in the background until it returns.
            inner.cancel()
            self.send(("timeout", call_id, f"cancelled after {timeout} s"))
            return
        try:
            value = inner.result()
        except BaseException as e:  # noqa: BLE001
            self.send(("error", call_id, describe(e)))
            return
        self._reply(call_id, value)


    def _watch(self) -> None:
        """Name the call that blocks the event loop. A call whose deadline passed ``BLOCKED_AFTER``
        seconds ago without being cancelled means the loop is not running; the task it is stuck in
        is then the culprit. The trainer kills this worker and sends the other calls elsewhere."""
        while True:
            time.sleep(WATCH_EVERY)
            now = time.monotonic()
            with self.watch_lock:
                if not any(now > deadline + BLOCKED_AFTER for _, deadline in self.watched.values()):
                    continue
                current = asyncio.current_task(self.loop)
                blocker = next((cid for cid, (task, _) in self.watched.items() if task is current), None)
            self.send(("blocked", blocker))
            return


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv if argv is None else argv
    fd = int(argv[1])
    os.set_inheritable(fd, False)  # a subprocess of a reward function must not keep the pipe open
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a segfaulting reward prints its Python stack before the worker dies
    _Server(Connection(fd)).serve()


if __name__ == "__main__":
    main()
