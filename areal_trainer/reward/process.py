"""One reward worker process, seen from the trainer: start it, talk to it, kill it and reap it.

A worker is ``python -m areal_trainer.reward.worker <fd>`` (:mod:`areal_trainer.reward.worker` is
its side of the pipe): a fresh interpreter, never a ``fork`` of the trainer. It gets the trainer's
``sys.path`` as ``PYTHONPATH``, so reward functions in the caller's own modules resolve there too,
and a session of its own, so that a kill reaches the subprocesses a reward function started while
Ctrl-C in the terminal does not (the trainer decides when workers stop).

A worker is stopped with SIGKILL to its whole process group, then reaped: a thread could not be
stopped (a C-level computation never releases the interpreter lock), a process always can.
:class:`Procs` holds every live worker of one pool apart from the pool itself, so the pool's
finalizer (garbage collection, interpreter exit) can kill them without keeping the pool alive.

Which calls go to which worker, and what becomes of them when one is lost, is
:mod:`areal_trainer.reward.dispatch`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Pipe
from typing import Any

logger = logging.getLogger(__name__)


def exit_text(returncode: int) -> str:
    """How a worker ended, in words: its exit code or the signal that killed it."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"worker process died (signal {-returncode}, {name})"
    return f"worker process died (exit code {returncode})"


class Procs:
    """Every live worker process of one pool; shared with the finalizer, which must not hold the pool."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live: set[subprocess.Popen] = set()
        self.closed = False


def kill(proc: subprocess.Popen) -> int:
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


def close_all(procs: Procs) -> None:
    """Mark the pool closed and kill every live worker (the pool's finalizer)."""
    with procs.lock:
        procs.closed = True
        live, procs.live = list(procs.live), set()
    for proc in live:
        kill(proc)


def await_exit(proc: subprocess.Popen, seconds: float) -> None:
    """Wait (without reaping) until ``proc`` has exited, at most ``seconds``: after EOF on its pipe the
    exit status is then its own, not the SIGKILL that :func:`kill` sends to clean up its group."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return
        except ChildProcessError:
            return
        time.sleep(0.002)


class Flight:
    """A call sent to a worker and not answered yet: where its outcome goes (``batch``, ``index``),
    how many times it was sent before, and when it is overdue."""

    __slots__ = ("batch", "index", "attempt", "deadline")

    def __init__(self, batch: Any, index: int, attempt: int, deadline: float):
        self.batch, self.index, self.attempt, self.deadline = batch, index, attempt, deadline


class Worker:
    """The trainer's handle on one worker process: ``starting`` -> ``ready`` <-> ``loading``, and
    ``dead`` once stopped. ``deadline`` bounds starting and loading; each call has its own."""

    def __init__(self, proc: subprocess.Popen, conn, deadline: float):
        self.proc, self.conn = proc, conn
        self.state, self.deadline = "starting", deadline
        self.loaded: set[str] = set()
        self.loading = ""  # the import path being loaded, in state "loading"
        self.inflight: dict[int, Flight] = {}

    @classmethod
    def start(cls, procs: Procs, name: str, start_timeout: float) -> Worker:
        """Start a worker process of the pool ``name``; it has ``start_timeout`` seconds to say ready."""
        parent, child = Pipe()
        # The worker sees this import path, so functions of the caller's own modules resolve.
        paths = [p or os.getcwd() for p in sys.path]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        cmd = [sys.executable, "-m", "areal_trainer.reward.worker", str(child.fileno())]
        with procs.lock:  # close() must not miss a worker started while it runs
            if procs.closed:
                parent.close()
                child.close()
                raise RuntimeError(f"the {name} worker pool is closed")
            # A session of its own: a kill reaches the worker's subprocesses, and Ctrl-C in the
            # terminal does not (the trainer decides when workers stop).
            proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
            procs.live.add(proc)
        child.close()
        return cls(proc, parent, time.monotonic() + start_timeout)

    def send(self, msg: tuple) -> bool:
        """Send ``msg``; False when the pipe is broken because the worker died just now."""
        try:
            self.conn.send(msg)
        except OSError:
            return False
        return True

    def soonest_deadline(self) -> float:
        """The earliest moment something of this worker is overdue (starting, loading or a call)."""
        deadlines = [self.deadline] if self.state != "ready" else []
        return min([*deadlines, *(f.deadline for f in self.inflight.values())], default=math.inf)

    def stop(self, procs: Procs) -> int:
        """Kill and reap the process, close the pipe; its return code. The calls in flight stay in
        ``inflight`` for the caller to settle."""
        self.state = "dead"
        with procs.lock:
            procs.live.discard(self.proc)
        returncode = kill(self.proc)
        self.conn.close()
        return returncode
