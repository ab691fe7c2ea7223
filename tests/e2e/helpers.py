"""Run the real command line in a subprocess, offline, inside a temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli_env(extra: dict | None = None) -> dict:
    """The environment of a test's training run: offline, no wandb, one thread unless ``OMP_NUM_THREADS``
    says otherwise (runs share the CPU with the test process; the thread count changes the float kernels'
    summation order, see tests/golden.py), plus ``extra``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS") or "1",
               PYTHONPATH=ROOT)
    env.update(extra or {})
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def cli(args: list[str], cwd: str, timeout: float = 300, check: bool = True,
        env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "areal_trainer", *args], cwd=cwd, env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}")
    return proc


def popen(args: list[str], cwd: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "areal_trainer", *args], cwd=cwd, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until ``path`` exists, failing with the run's stderr if it ends first, or after ``timeout`` s."""
    import time

    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.01)
