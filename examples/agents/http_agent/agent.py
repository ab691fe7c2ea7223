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
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

EPISODE = "examples.agents.http_agent.episode"
ROOT = str(Path(__file__).resolve().parents[3])
"""The directory holding ``examples/``, so the episode module is found from any working directory."""
STDERR_TAIL = 2000


def _env(base_url: str, api_key: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "PYTHONPATH": path}


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
