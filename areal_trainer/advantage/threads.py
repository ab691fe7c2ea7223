"""The number of torch intra-op threads the bound advantage computation runs on, and why it is one.

The computation is some hundred short, memory-bound passes over ``[B, S]`` tensors. With torch's
OpenMP backend each pass on two threads ends in a barrier. When another process holds a core (another
job, a second trainer) or the asynchronous rollout thread generates on it at the same time, that
barrier waits for a descheduled thread for a scheduler time slice, milliseconds per pass: the whole
computation then takes 10-20x longer than on one thread. One thread never waits, and on an idle
machine a second thread gains at most about 2x on a computation that takes milliseconds next to a
step's forwards and backwards. The figures are in ``docs/benchmarks.md`` (``scripts/bench_advantage.py``
measures both cases in one run).

The count changes no result: every kernel of the default computation gives the same bits on one and
on two threads (``tests/advantage/test_threads.py`` pins it). The thread count is process state, so it
is set around the call by :class:`~areal_trainer.advantage.stages.AdvantageFn`, the object the trainer
calls, never inside the pure functions of tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

ADVANTAGE_THREADS = 1
"""Intra-op threads of the bound advantage computation (see the module docstring)."""


@contextmanager
def intra_op_threads(n: int | None) -> Iterator[None]:
    """Run the block on ``n`` torch intra-op threads, then restore the caller's count.

    ``None`` or the current count changes nothing. With torch's OpenMP backend the count belongs to the
    calling thread: a thread that already ran torch operations (the asynchronous rollout thread) keeps its
    own meanwhile; only one whose first parallel operation falls inside the block starts with ``n``.
    """
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
