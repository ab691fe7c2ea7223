"""Reward functions used by the tests in this package; workers import them as ``tests.reward.plugins.<name>``."""

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import time


def behave(mode: str, value: float = 1.0):
    """Do what ``mode`` says: return, hang, raise, or end the process in one of several ways."""
    if mode == "ok":
        return value
    if mode == "pid":
        return os.getpid()
    if mode == "hang":
        time.sleep(3600)
    if mode == "spin":
        while True:
            pass
    if mode == "raise":
        raise ValueError("cannot parse the completion")
    if mode == "exit":
        os._exit(1)
    if mode == "sys_exit":
        sys.exit(3)
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "oom_kill":  # what the kernel's OOM killer does
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "nan":
        return float("nan")
    if mode == "none":
        return None
    if mode == "text":
        return "1.0"
    raise AssertionError(f"unknown mode {mode!r}")


def hang_with_child(pid_file: str):
    """Start a subprocess, write its pid, and hang: a timeout must kill the subprocess too."""
    child = subprocess.Popen(["sleep", "3600"])
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
    time.sleep(3600)


async def io_wait(seconds: float, mode: str = "ok"):
    """An async reward waiting on (simulated) I/O; ``mode`` as in :func:`behave`, plus ``block``."""
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "block":  # blocks the worker's event loop: only killing the worker ends it
        time.sleep(3600)
    await asyncio.sleep(seconds)
    return behave(mode)


def by_completion(prompt, completion, answer, **kwargs):
    """Per-sample reward: the completion says what to do (``"ok:0.5"``, ``"hang"``, ``"raise"``...)."""
    mode, _, value = completion.partition(":")
    return behave(mode, float(value) if value else 1.0)


def exact(prompt, completion, answer):
    return 1.0 if completion.strip() == str(answer) else 0.0


def close_enough(prompt, completion, answer, tolerance=0.0):
    """Per-sample reward with a row field: 1.0 when the number is within ``tolerance`` of the answer."""
    return 1.0 if abs(float(completion) - float(answer)) <= tolerance else 0.0


def _text(completion):
    return completion[-1]["content"] if isinstance(completion, list) else completion


def accuracy(completions, solution, **kwargs):
    """TRL-style batched reward: 1.0 where the completion equals the row's ``solution`` column."""
    return [1.0 if _text(c).strip() == s else 0.0 for c, s in zip(completions, solution)]


def length_or_none(completions, **kwargs):
    """Batched: None (not applicable) for empty completions, else the length."""
    return [float(len(c)) if c else None for c in completions]


def echo_kwargs(prompt, completion, answer, **kwargs):
    return kwargs


def takes_solution(prompt, completion, answer, solution, scale=1.0):
    return scale * (completion == solution)


async def async_exact(prompt, completion, answer):
    await asyncio.sleep(0)
    return 1.0 if completion == answer else 0.0


async def async_batched(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [1.0] * len(completions)


def one_arg(completion):
    return 0.0


def two_args(prompt, completion):
    return 0.0


def wrong_length(completions, **kwargs):
    return [1.0]


def not_a_list(completions, **kwargs):
    return 1.0


def mixed_batch(completions, **kwargs):
    return [float("nan"), None, True, 2]


def says_text(prompt, completion, answer):
    return "1.0"


def positional_only(prompt, completion, answer, extra, /):
    return 0.0


NOT_CALLABLE = 3


def solution_only(completions, solution):
    return [float(c == s) for c, s in zip(completions, solution)]
