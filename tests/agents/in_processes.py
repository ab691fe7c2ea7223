"""HTTP-form agents for ``tests/rollout/test_agent_processes.py``: each misbehaves in one way an agent in a process of
its own can (``rollout.agent_processes``). None of them talks to the endpoint: what is tested is the process."""

from __future__ import annotations

import asyncio
import os
import sys
import time


async def double(data, *, base_url, api_key):
    """Twice the row's ``x``; prints (to the process's standard output, which must not reach the trainer's pipe)."""
    print("an agent that prints", flush=True)
    sys.stdout.buffer.write(b"\x00\x00\x00\x05bytes")  # what would look like a frame, had stdout been the pipe
    sys.stdout.flush()
    await asyncio.sleep(0.01)
    return data["x"] * 2.0


async def where(data, *, base_url, api_key):
    """Where it runs: its process id, whether torch is loaded there, and what it was given."""
    return {"pid": os.getpid(), "torch": "torch" in sys.modules, "base_url": base_url, "api_key": api_key}


async def boom(data, *, base_url, api_key):
    raise ValueError(f"boom {data['x']}")


async def crash(data, *, base_url, api_key):
    """Row ``x == 1`` ends its process at once; the others finish after 0.5 s (so they are in flight then)."""
    if data["x"] == 1:
        os._exit(3)
    await asyncio.sleep(0.5)
    return 1.0


async def unpicklable(data, *, base_url, api_key):
    return lambda: 1.0


async def slow(data, *, base_url, api_key):
    await asyncio.sleep(60)


async def blocks(data, *, base_url, api_key):
    """Blocks its process's event loop (``time.sleep`` in an ``async def``)."""
    time.sleep(60)


def plain(data, *, base_url, api_key):
    """A plain ``def`` agent (runs in a thread of its process)."""
    return float(data["x"])


class Counter:
    """Built once per process with ``start``; counts the episodes it ran; writes ``closed_to`` at ``close()``."""

    def __init__(self, start: int, closed_to: str | None = None):
        self.n, self.closed_to = start, closed_to

    async def run(self, data, *, base_url, api_key):
        self.n += 1
        return float(self.n)

    async def close(self):
        if self.closed_to:
            with open(f"{self.closed_to}.{os.getpid()}", "w") as f:
                f.write(str(self.n))
