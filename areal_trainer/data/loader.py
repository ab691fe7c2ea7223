"""Deterministic, resumable batching of prompts: a seeded permutation per epoch and a cursor."""

from __future__ import annotations

import torch


class PromptLoader:
    """Yields lists of samples; ``state_dict()``/``load_state_dict()`` capture the exact position.

    With ``rank``/``world_size`` each rank gets a disjoint slice of every global batch.
    """

    def __init__(self, samples: list, batch_size: int, *, shuffle: bool, drop_last: bool, seed: int,
                 rank: int = 0, world_size: int = 1):
        if batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} must be divisible by the {world_size} processes")
        self.samples, self.batch_size, self.shuffle, self.drop_last = samples, batch_size, shuffle, drop_last
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.cursor = 0, 0
        n = len(samples)
        self.steps_per_epoch = n // batch_size if drop_last else -(-n // batch_size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{n} samples are fewer than one batch of {batch_size}")

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(len(self.samples))
        g = torch.Generator().manual_seed(self.seed * 100003 + epoch)
        return torch.randperm(len(self.samples), generator=g)

    def next_batch(self) -> list:
        """The next (local) batch; moves to the next epoch when this one is exhausted."""
        if self.cursor >= self.steps_per_epoch:
            self.epoch, self.cursor = self.epoch + 1, 0
        order = self._order(self.epoch)
        idx = order[self.cursor * self.batch_size: (self.cursor + 1) * self.batch_size]
        self.cursor += 1
        per_rank = len(idx) // self.world_size
        idx = idx[self.rank * per_rank: (self.rank + 1) * per_rank]
        return [self.samples[i] for i in idx.tolist()]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
