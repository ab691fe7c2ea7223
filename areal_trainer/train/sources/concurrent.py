"""Asynchronous rollout (``rollout.max_head_offpolicyness`` = eta > 0, ``offpolicy_mode=concurrent``):
a rollout thread generates on its own copy of the policy while the trainer trains, filling a buffer
of completed prompt groups; each step the trainer takes its batch, oldest first.

Admission. Before each workflow call the thread asks the staleness manager
(``rollout/staleness.py``) how many groups may start, and also keeps the groups generated or
generating but not yet trained within ``rollout.queue_size``. One call generates up to
``rollout.max_concurrent_rollouts`` groups (the engine batches them).

Order. Groups are handed to the trainer strictly in the order they were started (rejected ones are
skipped), which is what makes the staleness bound exact: a group started at version ``v`` is
trained at the latest at version ``v + eta``.

Weight updates. ``update_weights`` runs on the trainer's thread after each optimizer step: the
engine interrupts the generation in flight at a token boundary, loads the weights and lets it
continue under them (``rollout.partial_rollout``; otherwise it waits for the call to finish); then
admission uses the new version.

Failures. An exception in the rollout thread (a workflow that raises, a reward function over its
error budget) is raised again on the trainer's thread with its cause; a rollout that makes no
progress for ``rollout.request_timeout`` seconds stops the run with what the thread is doing.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable

from ...errors import UserError
from ...metrics import Max, Mean, Sum
from ...rollout.staleness import StalenessManager
from ...rollout.types import TrajectoryGroup
from .collect import Batch, rollout_groups, sampled_metrics


class RolloutFailed(UserError):
    """The rollout thread stopped with an error; the message names the cause."""


class _Clock:
    """Time spent with the trainer and/or the rollout thread busy, since the last :meth:`take`."""

    def __init__(self):
        self.trainer = True
        self.producer = False
        self.last = time.monotonic()
        self.spent = {"both": 0.0, "trainer": 0.0, "producer": 0.0, "neither": 0.0}

    def mark(self, *, trainer: bool | None = None, producer: bool | None = None) -> None:
        now = time.monotonic()
        key = {(True, True): "both", (True, False): "trainer", (False, True): "producer",
               (False, False): "neither"}[(self.trainer, self.producer)]
        self.spent[key] += now - self.last
        self.last = now
        self.trainer = self.trainer if trainer is None else trainer
        self.producer = self.producer if producer is None else producer

    def take(self) -> dict[str, float]:
        self.mark()
        out, self.spent = self.spent, dict.fromkeys(self.spent, 0.0)
        return out


class AsyncSource:
    """The rollout thread and its buffer (see the module docstring). ``batch_size``, the staleness
    manager and ``queue_size`` are this process's shares."""

    def __init__(self, *, loader, workflow, engine, gconfig, batch_size: int, accept: Callable | None,
                 dynamic_bs: bool, max_rounds: int, staleness: StalenessManager, queue_size: int,
                 request_timeout: float):
        self.loader, self.workflow, self.engine, self.gconfig = loader, workflow, engine, gconfig
        self.batch_size, self.accept, self.dynamic_bs, self.max_rounds = batch_size, accept, dynamic_bs, max_rounds
        self.staleness, self.queue_size, self.request_timeout = staleness, queue_size, request_timeout
        self._cv = threading.Condition()
        self._buffer: deque[tuple[TrajectoryGroup, bool]] = deque()
        self._in_flight: list[int] = []
        self._dropped: list[TrajectoryGroup] = []  # rejected groups of a fixed-size batch (stats only)
        self._error: BaseException | None = None
        self._stop = False
        self._clock = _Clock()
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._produce, name="areal-rollout", daemon=True)

    # -- rollout thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def _room(self) -> int:
        used = len(self._buffer) + len(self._in_flight)
        return min(self.staleness.capacity(), self.queue_size - used, self.staleness.max_concurrent)

    def _produce(self) -> None:
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(lambda: self._stop or self._room() > 0)
                    if self._stop:
                        return
                    ids = self.loader.take_local(self._room())
                    self._in_flight = ids
                    self.staleness.on_submitted(len(ids))
                    self._clock.mark(producer=True)
                groups = rollout_groups(self.workflow, [self.loader.samples[i] for i in ids], ids, self.gconfig)
                kept = [self.accept is None or bool(self.accept(g)) for g in groups]
                with self._cv:
                    for g, ok in zip(groups, kept):
                        (self.staleness.on_accepted if ok else self.staleness.on_rejected)()
                        if ok or self.dynamic_bs:
                            self._buffer.append((g, ok))
                        else:
                            self._dropped.append(g)
                    self._in_flight = []
                    self._last_progress = time.monotonic()
                    self._clock.mark(producer=False)
                    self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the trainer's thread
            with self._cv:
                if not self._stop:
                    self._error = e
                self._clock.mark(producer=False)
                self._cv.notify_all()

    # -- trainer thread ---------------------------------------------------------------------------
    def _ready(self) -> bool:
        # Fixed batch: only accepted groups are buffered; dynamic_bs: every attempt is.
        return len(self._buffer) >= self.batch_size

    def _check(self) -> None:
        """Raise when the rollout thread failed, cannot fill the batch, or stalls."""
        if self._error is not None:
            e = self._error
            if isinstance(e, UserError):
                raise RolloutFailed(f"the rollout thread stopped: {e}") from e
            raise RolloutFailed(f"the rollout thread stopped with {type(e).__name__}: {e}") from e
        if not self.dynamic_bs and self.accept is not None and \
                len(self._dropped) >= self.max_rounds * self.batch_size and len(self._buffer) < self.batch_size:
            raise UserError(
                f"rollout.dynamic_filter accepted only {len(self._buffer)} of "
                f"{len(self._buffer) + len(self._dropped)} prompt groups (needed {self.batch_size}; the limit is "
                f"rollout.max_sampling_rounds={self.max_rounds} batches' worth). Raise rollout.max_sampling_rounds "
                "or gconfig.n_samples, set dynamic_bs=true, or loosen the filter.")
        idle = time.monotonic() - self._last_progress
        if idle > self.request_timeout:
            raise RolloutFailed(f"the rollout made no progress for {idle:.0f} s (rollout.request_timeout="
                                f"{self.request_timeout:g}); the rollout thread is in:\n{self._where()}")

    def _where(self) -> str:
        frame = sys._current_frames().get(self._thread.ident)
        if frame is None:
            return "  (the thread has ended)"
        return "".join(traceback.format_stack(frame)[-4:]).rstrip()

    def next_batch(self, version: int) -> Batch:
        """The next ``batch_size`` groups (``dynamic_bs``: the accepted ones of the next ``batch_size``
        attempts), oldest first; waits for the rollout thread as needed."""
        t0 = time.monotonic()
        with self._cv:
            self._clock.mark(trainer=False)
            try:
                while not self._ready():
                    self._check()
                    self._cv.wait(timeout=0.5)
            finally:
                self._clock.mark(trainer=True)
            entries = [self._buffer.popleft() for _ in range(self.batch_size)]
            dropped, self._dropped = self._dropped, []
            buffered = len(self._buffer)
            spent = self._clock.take()
            self._cv.notify_all()
        accepted = [g for g, ok in entries if ok]
        sampled = [g for g, _ in entries] + dropped
        metrics = sampled_metrics(sampled, accepted)
        wall = max(sum(spent.values()), 1e-9)
        metrics.update({
            "time/rollout_wait": Max(time.monotonic() - t0), "rollout/buffered_groups": Sum(float(buffered)),
            "time/generation": Mean(spent["both"] + spent["producer"]),
            "rollout/overlap_frac": Mean(spent["both"] / wall),
            "rollout/trainer_idle_frac": Mean((spent["producer"] + spent["neither"]) / wall),
            "rollout/generator_idle_frac": Mean((spent["trainer"] + spent["neither"]) / wall),
            "rollout/oldest_version_lag": Max(float(version - min(g.min_version for g in accepted))
                                              if accepted else 0.0),
        })
        return Batch(accepted, metrics)

    def update_weights(self, model, version: int) -> None:
        """Hand the trainer's new weights (policy ``version``) to the rollout; admission follows them."""
        self.engine.update_weights(model, version)
        self.staleness.set_version(version)
        with self._cv:
            self._cv.notify_all()

    def state_dict(self) -> dict:
        """The loader's position, with the prompts handed out but not trained (in flight or buffered,
        oldest first) to be handed out again on resume."""
        with self._cv:
            pending = [*self._in_flight, *(g.prompt_id for g, _ in self._buffer)]
            return {"loader": self.loader.state_dict(pending)}

    def load_state_dict(self, state: dict, version: int) -> None:
        """Resume at policy ``version``: the loader's position (requeued prompts first) and the counters."""
        self.loader.load_state_dict(state["loader"])
        self.staleness.on_version_recovered(version)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the rollout thread (the generation in flight is abandoned at the next token)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        abort = getattr(self.engine, "abort", None)
        if abort is not None:
            abort()
        if self._thread.is_alive():
            self._thread.join(timeout)
