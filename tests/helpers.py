"""Helpers of the unit tests that wait for something: for a process to be gone, for a call to return. Each
wait has a generous bound that only a hang reaches, never a slow or busy machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

HANG = 120
"""Seconds after which a wait fails as a hang."""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (ended, not yet reaped) does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_dead(pid: int, seconds: float = HANG) -> bool:
    """Whether ``pid`` has ended within ``seconds`` (True as soon as it has)."""
    end = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def within(seconds: float, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``, failing the test if it has not returned after ``seconds`` (it is then left
    running in a daemon thread): for calls whose bug would be to never return."""
    out: dict[str, Any] = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} did not return within {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def right_padded(rows: list[list[int]]):
    """``(input_ids, attention_mask)``, ``[len(rows), longest]`` int64: the token rows padded on the right with 0
    (the rollout's ``stack_rows``)."""
    import torch

    from areal_trainer.rollout.rows import stack_rows

    batch = stack_rows([{"input_ids": torch.tensor(r), "attention_mask": torch.ones(len(r), dtype=torch.long)}
                        for r in rows])
    return batch["input_ids"], batch["attention_mask"]
