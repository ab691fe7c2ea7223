"""``rollout.agent_processes``: an HTTP-form agent's episodes in worker processes (``process_main.py``).

On the trainer's event loop, every request of an HTTP-form agent costs the trainer's one Python thread the
client's work too: with the ``openai`` package about 3 ms a request for typing the parameters, building the
request and parsing the reply, more than the endpoint's own work. Since a generation call waits for every
episode in flight (``engines/batcher.py``), that work adds up request after request before each call. In
``N`` processes it runs beside the trainer's on other cores, ``N`` episodes at a time, and what an agent does
to its process stays there.

:class:`AgentProcesses` keeps the ``N`` processes of one run: episode ``i`` goes to process ``i mod N`` (which
process serves an episode changes nothing in its rows: the engine samples the same calls in the same
order). Each process is started at its first episode and serves every rollout call until :meth:`close`.
Failures are the episode's, counted as the agent's (``agent/errors``):

* the agent raises, or returns what cannot be pickled: the episode fails with the process's description;
* the process ends (a crash, ``os._exit``, a kill): every episode it had fails, naming its exit status, and
  the next episode starts a new one (counted in ``agent/process_restarts``);
* it cannot set up the agent (an import that fails there): every episode fails with that reason, without
  a new process each time;
* an episode past ``rollout.agent_timeout`` is cancelled in its process; a process that does not answer a
  cancellation by the next rollout call has a blocked event loop and is killed (counted the same way).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from ...errors import UserError, integer_at_least
from . import process_main
from .process_main import read_frame, write_frame

CANCEL_GRACE_S = 2.0
"""How long a process may take to answer a cancellation before the next rollout call kills it."""
CLOSE_S = process_main.CLOSE_S + 10
"""How long a process may take to end at :meth:`AgentProcesses.close`: its agent's ``close()`` and a margin."""
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def check(agent: Any, n: Any, key: str = "rollout.agent_processes") -> str | None:
    """What is wrong with running ``agent`` (an ``AgentSpec``) in ``n`` processes; None when nothing."""
    bad_count = integer_at_least(key, n, 0, note="0: the agent runs in the trainer's process")
    if bad_count:
        return bad_count[0]
    if n and agent.style != "http":
        return (f"{key}={n}: {agent.path} takes a client (the in-process form), which cannot reach another "
                f"process; set {key}=0, or write the agent as run(data, *, base_url, api_key).")
    return None


class AgentProcessError(Exception):
    """An episode that failed in its agent process; ``description`` is what the trainer reports of it."""

    def __init__(self, description: str):
        super().__init__(description)
        self.description = description


class _Process:
    """One agent process, its episodes waiting for an answer, and the thread that reads its answers."""

    def __init__(self, index: int, path: str, kwargs: dict, loop: asyncio.AbstractEventLoop,
                 on_failed: Any):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
        self.index, self.loop, self.on_failed = index, loop, on_failed
        self.proc = subprocess.Popen([sys.executable, "-m", "areal_trainer.rollout.agents.process_main"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.pending: dict[int, asyncio.Future] = {}
        self.cancelled: dict[int, float] = {}
        """Episodes cancelled but not yet answered, with the moment of their cancellation."""
        self.ended: str | None = None
        self._lock = threading.Lock()
        self.send(("start", {"path": path, "kwargs": kwargs, "sys_path": [p for p in sys.path if p]}))
        self._reader = threading.Thread(target=self._read, name=f"areal-agent-process-{index}", daemon=True)
        self._reader.start()

    def send(self, message: Any) -> None:
        with self._lock:
            write_frame(self.proc.stdin, message)

    def _read(self) -> None:
        failed = None
        while True:
            try:
                message = read_frame(self.proc.stdout)
            except Exception as e:  # noqa: BLE001 - a garbled answer ends the process like a crash
                message = ("garbled", f"{type(e).__name__}: {e}")
            if message is None or message[0] in ("failed", "garbled"):
                failed = message[1] if message is not None and message[0] == "failed" else None
                break
            if message[0] == "done":
                self._call(self._answer, *message[1:])
        if message is not None and message[0] == "garbled":
            self.proc.kill()
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        why = failed or (f"the agent process (pid {self.proc.pid}) ended: "
                         + (f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"))
        self._call(self._end, why, failed is not None)

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody waits for these episodes any more
            pass

    def _answer(self, eid: int, ok: bool, value: Any) -> None:
        self.cancelled.pop(eid, None)
        future = self.pending.pop(eid, None)
        if future is not None and not future.done():
            future.set_result(value) if ok else future.set_exception(AgentProcessError(value))

    def _end(self, why: str, setup_failed: bool) -> None:
        self.ended = why
        if setup_failed:
            self.on_failed(why)
        for future in self.pending.values():
            if not future.done():
                future.set_exception(AgentProcessError(why))
        self.pending.clear()
        self.cancelled.clear()

    def stuck(self, now: float) -> bool:
        return any(now - t > CANCEL_GRACE_S for t in self.cancelled.values())

    def stop(self, timeout: float) -> None:
        """Ask the process to end (its agent's ``close()`` runs there), kill it after ``timeout`` seconds."""
        if self.proc.poll() is None:
            try:
                self.send(("close",))
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._reader.join(timeout=10)


class AgentProcesses:
    """The ``n`` agent processes of one run (see the module docstring). :meth:`run` and :meth:`begin` are called
    on the episodes' event loop; :meth:`close` from any other thread."""

    def __init__(self, path: str, kwargs: dict, n: int):
        if n < 1:
            raise ValueError(f"AgentProcesses: n={n}; at least one process.")
        self.path, self.kwargs, self.n = path, dict(kwargs), n
        self._procs: list[_Process | None] = [None] * n
        self._ids = itertools.count()
        self.restarts = 0
        """Processes started again after one of the run ended (a crash, a kill, a blocked loop)."""
        self.setup_failure: str | None = None
        """Why the agent could not be set up in its process (then no process is started again)."""

    @classmethod
    def of(cls, agent: Any, n: int) -> AgentProcesses | None:
        """The processes of ``agent`` (an ``AgentSpec``) for ``rollout.agent_processes=n``; None for 0."""
        problem = check(agent, n)
        if problem:
            raise UserError(problem)
        return cls(agent.path, agent.kwargs, n) if n else None

    def _process(self, index: int) -> _Process:
        proc = self._procs[index]
        if proc is not None and proc.ended is None and proc.loop is asyncio.get_running_loop():
            return proc
        if self.setup_failure is not None:
            raise AgentProcessError(self.setup_failure)
        if proc is not None:
            self.restarts += 1
            proc.stop(0)
        proc = _Process(index, self.path, self.kwargs, asyncio.get_running_loop(), self._setup_failed)
        self._procs[index] = proc
        return proc

    def _setup_failed(self, why: str) -> None:
        self.setup_failure = why

    async def run(self, episode: int, data: dict, kwargs: dict) -> Any:
        """Episode ``episode``'s result from its process (``kwargs``: ``base_url`` and ``api_key``); raises
        :class:`AgentProcessError` when it failed there."""
        proc = self._process(episode % self.n)
        eid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        try:
            proc.send(("run", eid, data, kwargs))
        except (OSError, ValueError) as e:  # the process is gone (its reader reports why) or the pipe closed
            raise AgentProcessError(proc.ended or f"the agent process (pid {proc.proc.pid}) cannot be reached: "
                                    f"{type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001 - pickling: a column the process cannot receive
            raise AgentProcessError(f"the dataset row cannot be sent to the agent process: {type(e).__name__}: "
                                    f"{e}") from None
        proc.pending[eid] = future
        try:
            return await future
        except asyncio.CancelledError:
            if proc.pending.pop(eid, None) is not None and proc.ended is None:
                proc.cancelled[eid] = time.monotonic()
                try:
                    proc.send(("cancel", eid))
                except OSError:
                    pass
            raise

    async def begin(self) -> None:
        """Before a rollout call: kill the processes that did not answer a cancellation (a blocked event loop),
        after giving them ``CANCEL_GRACE_S`` from the cancellation."""
        waiting = [p for p in self._procs if p is not None and p.ended is None and p.cancelled]
        if not waiting:
            return
        latest = max(t for p in waiting for t in p.cancelled.values())
        await asyncio.sleep(max(0.0, latest + CANCEL_GRACE_S - time.monotonic()) + 0.05)
        for p in waiting:
            if p.ended is None and p.stuck(time.monotonic()):
                p.proc.kill()
                p.ended = (f"the agent process (pid {p.proc.pid}) did not end cancelled episodes within "
                           f"{CANCEL_GRACE_S:g} s (its event loop is blocked) and was killed")

    def close(self, timeout: float = CLOSE_S) -> None:
        """End every process: each closes its agent (``close()``) and exits; one still running after ``timeout``
        seconds is killed."""
        procs, self._procs = [p for p in self._procs if p is not None], [None] * self.n
        threads = [threading.Thread(target=p.stop, args=(timeout,), daemon=True) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
