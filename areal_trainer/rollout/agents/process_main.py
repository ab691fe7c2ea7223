"""An agent process: runs episodes of an HTTP-form agent for the trainer (``processes.py`` starts it).

``rollout.agent_processes=N`` runs an agent of the HTTP form (``run(data, *, base_url, api_key)``) in ``N``
such processes instead of on the trainer's event loop. Its Python work (the ``openai`` package typing each
request and parsing each reply, the agent's own logic, its tools) then runs on other cores, beside the
trainer's, and whatever it does to its process (a crash, ``sys.exit``, a leak, a blocked event loop) ends
in that process, not in the trainer. The agent reaches the policy through the run's endpoint as before.

Started as ``python -m areal_trainer.rollout.agents.process_main``; it imports neither torch nor the
trainer's models. The protocol is frames (a 4-byte big-endian length, then a pickle) on its standard input
and output; what the agent prints goes to standard error, so it cannot corrupt them:

* from the trainer, first ``("start", {"path", "kwargs", "sys_path"})``, then ``("run", id, data, kwargs)``,
  ``("cancel", id)`` and ``("close",)``; the end of its input (the trainer is gone) ends the process too;
* to the trainer, ``("ready", pid)`` or ``("failed", description)`` once, then ``("done", id, ok, value)``
  per episode: its result, or (``ok`` false) the description of its failure in the trainer's format.

A cancelled episode is cancelled on the process's loop (a plain ``def run`` is left running in its
thread, as in the trainer) and answered ``done`` at once; an agent that blocks the loop never answers,
and the trainer kills the process (``processes.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import signal
import struct
import sys
import threading
from typing import Any, BinaryIO

from .loop import DaemonExecutor, describe
from .spec import call_agent, close_method, load_agent

HEADER = struct.Struct(">I")
CLOSE_S = 30.0
"""How long the agent's ``close()`` may take when the process ends."""


def write_frame(stream: BinaryIO, message: Any) -> None:
    """Send one message (raises ``pickle.PicklingError``/``TypeError`` for what cannot be pickled, before any
    byte is written)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO) -> Any:
    """The next message; None at the end of the stream."""
    header = _read_exactly(stream, HEADER.size)
    if header is None:
        return None
    data = _read_exactly(stream, HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class Agent:
    """The resolved agent of this process: its ``run`` and the instance a class agent is built into."""

    def __init__(self, path: str, kwargs: dict):
        self.spec = load_agent(path, kwargs)
        self.instance = self.spec.target(**self.spec.kwargs) if self.spec.is_class else None

    async def run(self, data: dict, kwargs: dict) -> Any:
        return await call_agent(self.spec, self.instance, data, **kwargs)

    async def close(self) -> None:
        close = close_method(self.instance)
        if close is not None:
            result = close()
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, CLOSE_S)


class Server:
    """The process's episodes on its event loop, answered in frames on ``out``."""

    def __init__(self, agent: Agent, inp: BinaryIO, out: BinaryIO):
        self.agent, self.inp, self.out = agent, inp, out
        self.tasks: dict[int, asyncio.Task] = {}

    def send(self, message: Any) -> None:
        write_frame(self.out, message)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(DaemonExecutor())  # a plain def run past its time is left to run, not awaited
        inbox: asyncio.Queue = asyncio.Queue()

        def read() -> None:  # a thread: the input is always drained, whatever the loop does
            while True:
                message = read_frame(self.inp)
                loop.call_soon_threadsafe(inbox.put_nowait, message)
                if message is None or message[0] == "close":
                    # The trainer is gone or ends the run: a loop the agent blocks must not keep this process.
                    deadline = threading.Timer(CLOSE_S + 5, os._exit, args=(1,))
                    deadline.daemon = True  # a process that ends in time does not wait for it
                    deadline.start()
                    return

        threading.Thread(target=read, name="areal-agent-process-input", daemon=True).start()
        while True:
            message = await inbox.get()
            if message is None or message[0] == "close":
                break
            if message[0] == "run":
                _, eid, data, kwargs = message
                self.tasks[eid] = loop.create_task(self.episode(eid, data, kwargs))
            elif message[0] == "cancel" and message[1] in self.tasks:
                self.tasks[message[1]].cancel()
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        try:
            await self.agent.close()
        except Exception as e:  # noqa: BLE001 - the run is ending; reported, not raised
            print(f"warning: rollout.agent {self.agent.spec.path}: its close() failed in its agent process: "
                  f"{describe(e)}", file=sys.stderr, flush=True)

    async def episode(self, eid: int, data: dict, kwargs: dict) -> None:
        try:
            result = await self.agent.run(data, kwargs)
        except asyncio.CancelledError:
            self.send(("done", eid, False, "cancelled"))
            return
        except Exception as e:  # noqa: BLE001 - the agent's error goes to the trainer, which counts it
            self.send(("done", eid, False, describe(e)))
            return
        finally:
            self.tasks.pop(eid, None)
        try:
            self.send(("done", eid, True, result))
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            self.send(("done", eid, False, f"the agent returned a {type(result).__name__} that cannot be sent to "
                       f"the trainer ({type(e).__name__}: {e}); return a float or {{completion_id: reward}}"))


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the trainer ends us
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the agent prints (to fd 1 or sys.stdout) goes to standard error, not into the frames
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    start = read_frame(inp)
    if start is None or start[0] != "start":
        return 2
    settings = start[1]
    sys.path[:] = list(dict.fromkeys([*settings["sys_path"], *sys.path]))
    try:
        agent = Agent(settings["path"], settings["kwargs"])
    except Exception as e:  # noqa: BLE001 - told to the trainer, which names it for every episode
        write_frame(out, ("failed", f"the agent could not be set up in its process: {describe(e)}"))
        return 1
    write_frame(out, ("ready", os.getpid()))
    asyncio.run(Server(agent, inp, out).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
