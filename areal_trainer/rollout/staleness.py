"""Admission control for asynchronous rollout: how many new prompt groups may start generating now
so that no trained token is more than ``max_head_offpolicyness`` (eta) policy versions old.

AReaL's rule (``areal/infra/staleness_manager.py``), counted in prompt groups. At policy version
``v``, with ``running`` groups generating and ``accepted`` groups accepted so far (over the whole
run; consumption never decrements it)::

    capacity = min(max_concurrent - running, (eta + v + 1) * consumer_bs - (accepted + running))

New groups start only while ``capacity > 0`` (it can be negative). The trainer consumes
``consumer_bs`` groups per version, oldest first, so a group started at version ``v`` is among the
first ``(eta + v + 1) * consumer_bs`` and is trained at the latest at version ``v + eta``: staleness
is at most eta (``eta = 0`` is synchronous RL). Groups rejected by the dynamic filter do not count,
because the trainer does not consume them; except when the trainer consumes a fixed number of
*attempts* per step (``dynamic_bs``), where they must count (``count_rejected``), or the bound breaks.

On resume at version ``V``, ``accepted = V * consumer_bs``: capacity returns to ``(eta + 1) *
consumer_bs - running`` instead of bursting.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class StalenessCounts:
    """A snapshot of the counters."""

    submitted: int
    running: int
    accepted: int
    rejected: int
    version: int


class StalenessManager:
    """Thread-safe counters and the capacity rule. ``max_concurrent`` and ``consumer_bs`` are this
    process's shares (minimum 1)."""

    def __init__(self, *, max_head_offpolicyness: int, consumer_bs: int, max_concurrent: int,
                 count_rejected: bool = False, version: int = 0):
        if max_head_offpolicyness < 0:
            raise ValueError(f"max_head_offpolicyness must be >= 0; got {max_head_offpolicyness}")
        self.eta = int(max_head_offpolicyness)
        self.consumer_bs = max(1, int(consumer_bs))
        self.max_concurrent = max(1, int(max_concurrent))
        self.count_rejected = count_rejected
        self._lock = threading.Lock()
        self._submitted = self._running = self._accepted = self._rejected = 0
        self._version = int(version)

    def capacity(self, version: int | None = None) -> int:
        """How many new groups may start at ``version`` (default: the current one); may be negative."""
        with self._lock:
            v = self._version if version is None else int(version)
            concurrency = self.max_concurrent - self._running
            consumed = self._accepted + (self._rejected if self.count_rejected else 0)
            staleness = (self.eta + v + 1) * self.consumer_bs - (consumed + self._running)
            return min(concurrency, staleness)

    def set_version(self, version: int) -> None:
        with self._lock:
            self._version = int(version)

    def on_submitted(self, n: int = 1) -> None:
        with self._lock:
            self._submitted += n
            self._running += n

    def on_accepted(self, n: int = 1) -> None:
        with self._lock:
            self._running -= n
            self._accepted += n

    def on_rejected(self, n: int = 1) -> None:
        with self._lock:
            self._running -= n
            self._rejected += n

    def on_version_recovered(self, version: int) -> None:
        """Resume at ``version``: everything before it counts as consumed."""
        with self._lock:
            self._version = int(version)
            self._accepted = int(version) * self.consumer_bs
            self._rejected = 0

    def counts(self) -> StalenessCounts:
        with self._lock:
            return StalenessCounts(self._submitted, self._running, self._accepted, self._rejected, self._version)
