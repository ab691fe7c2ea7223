"""An agent in another process: each episode runs ``python -m examples.agents.http_agent.episode``.

``run(data, *, base_url, api_key)`` is the HTTP style of ``rollout.agent``: the trainer serves an
OpenAI-compatible endpoint at ``base_url`` and gives every episode a key of its own. The episode
process gets both through ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (which the ``openai`` package
reads), the dataset row as JSON on stdin, and prints its reward as the last line of stdout. Any
program that speaks the OpenAI chat API could take its place.

A process that exits with an error or prints no reward makes ``run`` raise with the end of its
stderr, so the trainer counts the episode as an error (``agent/errors``). When the episode is
cancelled (``rollout.agent_timeout``) the process is killed: it never outlives its episode, and its
key stops working anyway once the episode ends.

    python -m areal_trainer --config-name grpo rollout.agent=examples.agents.http_agent.agent.run

Starting a Python process that imports ``openai`` costs about 0.6 s of CPU, more than a tiny model's
whole episode. :class:`EpisodeServer` is the same agent with one long-lived process that runs many
episodes at once (``episode.py --serve``), each with its own key, as an agent service would:

    python -m areal_trainer --config-name grpo rollout.agent=examples.agents.http_agent.agent.EpisodeServer
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
from pathlib import Path

EPISODE = "examples.agents.http_agent.episode"
ROOT = str(Path(__file__).resolve().parents[3])
"""The directory holding ``examples/``, so the episode module is found from any working directory."""
STDERR_TAIL = 2000


def _env(base_url: str | None = None, api_key: str | None = None) -> dict[str, str]:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    endpoint = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key} if base_url is not None else {}
    return {**os.environ, **endpoint, "PYTHONPATH": path}


def _reward(stdout: bytes) -> float | None:
    lines = [line.strip() for line in stdout.decode(errors="replace").splitlines() if line.strip()]
    try:
        return float(lines[-1]) if lines else None
    except ValueError:
        return None


async def run(data, *, base_url, api_key) -> float:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", EPISODE, env=_env(base_url, api_key),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await proc.communicate(json.dumps(data, default=str).encode())
    finally:
        if proc.returncode is None:  # cancelled (a timeout) or failed while it ran
            proc.kill()
            await proc.wait()
    reward = _reward(out)
    if proc.returncode != 0 or reward is None:
        why = f"exited with {proc.returncode}" if proc.returncode != 0 else "printed no reward"
        tail = err.decode(errors="replace")[-STDERR_TAIL:].strip() or "(no stderr)"
        raise RuntimeError(f"{EPISODE} {why}; its stderr ends with:\n{tail}")
    return reward


class EpisodeServer:
    """The agent above with one long-lived episode process for all its episodes (``episode.py --serve``).

    ``rollout.agent=examples.agents.http_agent.agent.EpisodeServer``: the trainer builds one instance per
    workflow (training, held-out evaluation), which starts its process at the first episode and again
    after the process has died. Each ``run`` sends the row, the endpoint and the episode's key as one
    JSON line and awaits the process's answer for that episode: a reward, or an error that ``run``
    raises (``agent/errors``). A cancelled episode is cancelled in the process too. If the process ends,
    every episode waiting on it raises with the end of its stderr. ``aclose()`` (awaited by the trainer
    at the end of the run) closes the process's stdin, so it cancels what still runs and exits; a
    process that has not exited after ``CLOSE_WAIT`` seconds is killed.
    """

    CLOSE_WAIT = 10.0

    def __init__(self):
        self._proc: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Future] = []
        self._pending: dict[int, asyncio.Future] = {}
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=64)
        self._next = 0
        self._starting = asyncio.Lock()

    async def _start(self) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", EPISODE, "--serve", env=_env(), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self._stderr.clear()
        self._pending = {}  # this process's episodes: a process that ended fails only its own
        self._readers = [asyncio.ensure_future(self._answers(proc, self._pending)),
                         asyncio.ensure_future(self._drain(proc))]
        return proc

    async def _drain(self, proc) -> None:
        """Keep the end of the process's stderr (read as it comes, so that the pipe never fills)."""
        while line := await proc.stderr.readline():
            self._stderr.append(line)

    async def _answers(self, proc, pending: dict[int, asyncio.Future]) -> None:
        """Hand each answer line to its episode; once the process has ended, fail those still waiting."""
        while line := await proc.stdout.readline():
            try:
                msg = json.loads(line)
                future = pending.pop(msg["id"], None)
            except (ValueError, KeyError, TypeError):
                continue  # not an answer: output of the episodes' own code
            if future is not None and not future.done():
                future.set_result(msg)
        code = await proc.wait()
        await self._readers[1]
        tail = b"".join(self._stderr).decode(errors="replace")[-STDERR_TAIL:].strip() or "(no stderr)"
        for future in pending.values():
            if not future.done():
                future.set_exception(RuntimeError(f"{EPISODE} --serve exited with {code} during the episode; "
                                                  f"its stderr ends with:\n{tail}"))
        pending.clear()

    @staticmethod
    def _send(proc, msg: dict) -> None:
        proc.stdin.write((json.dumps(msg, default=str) + "\n").encode())

    async def run(self, data, *, base_url, api_key) -> float:
        async with self._starting:  # episodes that arrive together share one new process
            if self._proc is None or self._proc.returncode is not None:
                self._proc = await self._start()
        proc, pending = self._proc, self._pending
        n, self._next = self._next, self._next + 1
        answer = pending[n] = asyncio.get_running_loop().create_future()
        self._send(proc, {"id": n, "base_url": base_url, "api_key": api_key, "row": data})
        try:
            msg = await answer
        except asyncio.CancelledError:
            if pending.pop(n, None) is not None and proc.returncode is None:
                self._send(proc, {"cancel": n})
            raise
        if "error" in msg:
            raise RuntimeError(f"{EPISODE} --serve: the episode failed: {msg['error']}")
        return float(msg["reward"])

    async def aclose(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), self.CLOSE_WAIT)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)
