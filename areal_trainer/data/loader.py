"""Deterministic, resumable batching of prompts: a seeded permutation per epoch and a cursor.

Two ways to draw, one per run:

* ``take(n)`` (synchronous training): ``n`` samples of the global order, this rank's contiguous
  ``n / world_size`` of them; every rank draws the same ``n`` at the same time. The cursor counts
  global positions, so a round of dynamic sampling can ask for exactly what it still needs.
* ``take_local(n)`` (asynchronous training, where each process's rollout thread draws on its own
  schedule): this rank's next ``n`` of its shard ``order[rank::world_size]`` of every epoch; the
  cursor counts positions in the shard. Prompts handed out but not trained when a checkpoint is
  written go back to the front of the queue on resume (``requeue``), so within an epoch no prompt
  is lost or trained twice.

``state_dict()`` captures the exact position.
"""

from __future__ import annotations

import math

import torch


def steps_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    """Steps of one pass over ``n`` prompts, ``batch_size`` (global) per step; a last partial batch counts
    unless ``drop_last``."""
    return n // batch_size if drop_last else -(-n // batch_size)


def run_length(epochs: int, max_steps: int | None, per_epoch: int, n: int, batch_size: int) -> tuple[int, str | None]:
    """``(the step a run stops at, a notice or None)``: ``epochs`` passes of ``per_epoch`` steps, or
    ``max_steps`` if that comes first. The notice says when ``max_steps`` asks for more than the epochs
    allow (the smaller wins), with the ``total_train_epochs`` that would allow it."""
    total = epochs * per_epoch
    if not max_steps or max_steps <= total:
        return (min(total, max_steps) if max_steps else total), None
    needed = math.ceil(max_steps / per_epoch)
    return total, (f"total_train_steps={max_steps} is more than total_train_epochs={epochs} allows: {per_epoch} "
                   f"steps per epoch ({n} prompts, {batch_size} per step) x {epochs} epoch{'s' * (epochs != 1)}, "
                   f"so the run stops at step {total}. Set total_train_epochs={needed} to run all {max_steps} steps.")


class PromptLoader:
    """Yields samples (and their dataset row indices). With ``rank``/``world_size`` each rank gets a
    disjoint share."""

    def __init__(self, samples: list, batch_size: int, *, shuffle: bool, drop_last: bool, seed: int,
                 rank: int = 0, world_size: int = 1, mode: str = "global"):
        if batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} must be divisible by the {world_size} processes")
        self.samples, self.batch_size, self.shuffle, self.drop_last = samples, batch_size, shuffle, drop_last
        self.seed, self.rank, self.world_size = seed, rank, world_size
        if mode not in ("global", "local"):
            raise ValueError(f"mode must be 'global' or 'local'; got {mode!r}")
        self.epoch, self.cursor = 0, 0
        self.mode = mode
        """``global`` (``take``) or ``local`` (``take_local``); the two never mix."""
        self.requeue: list[int] = []
        """Row indices handed out first by ``take_local`` (prompts of an interrupted run)."""
        n = len(samples)
        self.steps_per_epoch = steps_per_epoch(n, batch_size, drop_last)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{n} samples are fewer than one batch of {batch_size}")
        self._order_cache: tuple[int, torch.Tensor] | None = None

    def _order(self, epoch: int) -> torch.Tensor:
        if self._order_cache is None or self._order_cache[0] != epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 100003 + epoch)
                order = torch.randperm(len(self.samples), generator=g)
            else:
                order = torch.arange(len(self.samples))
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def _epoch_len(self) -> int:
        return self.steps_per_epoch * self.batch_size if self.drop_last else len(self.samples)

    def _use(self, mode: str) -> None:
        if self.mode != mode:
            raise RuntimeError(f"this is a {self.mode} loader; it cannot be drawn from in {mode} mode")

    def take_ids(self, n: int) -> list[int]:
        """Row indices of the next ``n`` samples (this rank's ``n / world_size`` of them), crossing epochs."""
        self._use("global")
        idx: list[int] = []
        while len(idx) < n:
            if self.cursor >= self._epoch_len():
                self.epoch, self.cursor = self.epoch + 1, 0
            k = min(n - len(idx), self._epoch_len() - self.cursor)
            idx += self._order(self.epoch)[self.cursor: self.cursor + k].tolist()
            self.cursor += k
        per_rank = n // self.world_size
        return idx[self.rank * per_rank: (self.rank + 1) * per_rank]

    def take(self, n: int) -> list:
        """The next ``n`` samples (this rank's ``n / world_size`` of them), crossing epochs as needed."""
        return [self.samples[i] for i in self.take_ids(n)]

    def next_batch(self) -> list:
        return self.take(self.batch_size)

    def take_local(self, n: int) -> list[int]:
        """Row indices of this rank's next ``n`` prompts: first the requeued ones, then its shard."""
        self._use("local")
        idx = self.requeue[:n]
        del self.requeue[:n]
        while len(idx) < n:
            shard = self._order(self.epoch)[: self._epoch_len()][self.rank::self.world_size]
            if self.cursor >= len(shard):
                self.epoch, self.cursor = self.epoch + 1, 0
                continue
            k = min(n - len(idx), len(shard) - self.cursor)
            idx += shard[self.cursor: self.cursor + k].tolist()
            self.cursor += k
        return idx

    def state_dict(self, pending: list[int] | None = None) -> dict:
        """The position; ``pending``: row indices handed out but not trained, to be requeued on resume."""
        state = {"epoch": self.epoch, "cursor": self.cursor, "mode": self.mode}
        if self.mode == "local":
            state["requeue"] = [*(pending or []), *self.requeue]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore a position; raises ``ValueError`` for the state of a loader of the other mode."""
        saved = state.get("mode", "global")
        if saved != self.mode:
            raise ValueError(f"the saved position is that of a {saved} loader, this one is {self.mode}")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self.requeue = [int(i) for i in state.get("requeue", [])]
