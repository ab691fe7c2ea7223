"""Deterministic, resumable batching of prompts: a seeded permutation per epoch and a cursor.

The cursor counts samples, so a round of dynamic sampling can ask for exactly the number of prompts
it still needs without skipping any; ``state_dict()`` captures the exact position.
"""

from __future__ import annotations

import torch


class PromptLoader:
    """Yields lists of samples. With ``rank``/``world_size`` each rank gets a disjoint slice of
    every global request."""

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

    def take(self, n: int) -> list:
        """The next ``n`` samples (this rank's ``n / world_size`` of them), crossing epochs as needed."""
        idx: list[int] = []
        while len(idx) < n:
            if self.cursor >= self._epoch_len():
                self.epoch, self.cursor = self.epoch + 1, 0
            k = min(n - len(idx), self._epoch_len() - self.cursor)
            idx += self._order(self.epoch)[self.cursor: self.cursor + k].tolist()
            self.cursor += k
        per_rank = n // self.world_size
        return [self.samples[i] for i in idx[self.rank * per_rank: (self.rank + 1) * per_rank]]

    def next_batch(self) -> list:
        return self.take(self.batch_size)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
