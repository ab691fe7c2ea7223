"""Run the real command line in a subprocess, offline, inside a temporary directory; wait for what a run
reports (never for a guessed time), and read what it wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from . import forkserver

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG = 300
"""Seconds after which a wait of an e2e test fails as a hang: far past what a healthy run takes on a slow,
shared machine, so that only a run that is stuck reaches it."""


def cli_env(extra: dict | None = None) -> dict:
    """The environment of a test's training run: offline, no wandb, one thread unless ``OMP_NUM_THREADS``
    says otherwise (runs share the CPU with the test process; the thread count changes the float kernels'
    summation order, see tests/golden.py), plus ``extra``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS") or "1",
               PYTHONPATH=ROOT)
    env.update(extra or {})
    env.pop("PYTEST_CURRENT_TEST", None)
    # A test that ran wandb in this process left the address of its wandb service here: a run given it would
    # write through that service, in this process's file system view, not its own.
    env.pop("WANDB_SERVICE", None)
    return env


def cli(args: list[str], cwd: str, timeout: float = HANG, check: bool = True,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m areal_trainer *args`` run to its end (forked from a server that has imported the trainer,
    see :mod:`.forkserver`, where the environment allows); fails with its output unless it exits 0 or
    ``check`` is false."""
    full = cli_env(env)
    proc = forkserver.run(args, cwd, full, timeout, base=cli_env())
    if proc is None:
        proc = subprocess.run([sys.executable, "-m", "areal_trainer", *args], cwd=cwd, env=full,
                              capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}")
    return proc


def popen(args: list[str], cwd, env: dict | None = None,
          stdout: int = subprocess.PIPE) -> subprocess.Popen | forkserver.ForkedRun:
    """``python -m areal_trainer *args`` started and left running (forked where the environment allows, as
    :func:`cli`), with its stderr on a pipe and its stdout on one or ``stdout`` (a forked run's goes to a
    file either way): ``send_signal``, ``poll``, ``wait``, ``communicate``, ``pid``."""
    full = cli_env(env)
    proc = forkserver.start(args, cwd, full, base=cli_env())
    if proc is None:
        proc = subprocess.Popen([sys.executable, "-m", "areal_trainer", *args], cwd=cwd, env=full,
                                stdout=stdout, stderr=subprocess.PIPE, text=True)
    return proc


def wait_until(done: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = HANG) -> None:
    """Wait until ``done()`` holds, failing with the run's stderr if it ends first, or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        # Poll before asking ``done()``: a run that reaches ``what`` and ends between the two is then judged
        # on its final state, and an end is an error only where ``what`` did not hold at it.
        ended = proc.poll() is not None
        if done():
            return
        if ended:
            err = proc.stderr.read()[-3000:] if proc.stderr else ""
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}\n{err}")
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.01)


def wait_for(path, proc: subprocess.Popen, timeout: float = HANG) -> None:
    """Wait until ``path`` exists, failing with the run's stderr if it ends first, or after ``timeout`` s."""
    wait_until(path.exists, proc, str(path), timeout)


def killed_after_checkpoint(args: list[str], cwd, run_dir, step: int) -> list[int]:
    """Start a run and SIGKILL it as soon as its checkpoint ``step`` is complete; the steps of the checkpoint
    directories it left (see :func:`checkpoint_steps`)."""
    proc = popen(args, cwd=cwd)
    wait_for(run_dir / "checkpoints" / f"step_{step}" / "COMPLETE", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return checkpoint_steps(run_dir)


def ended(proc: subprocess.Popen, what: str, timeout: float = HANG) -> str:
    """The stderr of ``proc`` once it has ended; kills it and fails naming ``what`` if it is still running
    after ``timeout`` s."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the run did not stop within {timeout} s of {what}") from None


def step_records(run_dir, key: str = "time/step") -> dict[int, dict]:
    """The records of ``run_dir``'s metrics file that hold ``key``, by step: by default the training steps'. A
    last line without its newline is one the running trainer is still writing, and is left out."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        lines = [line for line in f if line.endswith("\n")]
    return {r["step"]: r for r in map(json.loads, lines) if key in r}


def comparable(record: dict) -> dict:
    """A record without its timings, which differ between two runs that train alike."""
    return {k: v for k, v in record.items() if not k.startswith(("time/", "perf/"))}


def checkpoint_steps(run_dir) -> list[int]:
    """The steps of the checkpoint directories ``step_<n>`` in ``run_dir``, complete or not, in order."""
    names = os.listdir(os.path.join(run_dir, "checkpoints"))
    return sorted(int(m[1]) for m in map(re.compile(r"step_(\d+)").fullmatch, names) if m)


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def processes_left(marker: str, within: float = 60) -> list[int]:
    """The processes whose environment holds ``marker`` that are still alive ``within`` s from now (or
    none, as soon as none is): a process killed a moment ago may not have gone yet."""
    deadline = time.monotonic() + within
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def tiny_classifier(path) -> str:
    """A randomly initialised reward model on the built-in tokenizer, saved at ``path``: its scores say
    nothing of correctness."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from areal_trainer.model import builtin

    tok = builtin.build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, num_labels=1,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
