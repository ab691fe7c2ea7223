"""A multi-turn environment as an agent (``rollout/agents``): :class:`EnvironmentAgent` plays one episode per
call, over the run's client, so every token trained is one the rollout sampled, and keeps what the rows cannot
say (its score's parts, its failures) in an :class:`EpisodeRecord` per episode, found again by the row's
:data:`~areal_trainer.environments.base.KEY` (``workflow.py`` turns them into ``env/*`` metrics).

Failures. An environment that fails (``reset``, ``step``, scoring or a task's tool servers raise, or a reward is
not a finite number) does not end the episode as an agent error: the episode scores ``reward.error_value``, is
counted (``env/errors``, ``env/bad_rewards``) and the first of each kind is named in one line; the run stops
only when every episode of a rollout call failed so (``workflow.py``).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..metrics import Mean, Metric, Sum
from .base import KEY, EnvironmentFailure, warn_once

COUNTERS = ("episodes", "errors", "bad_rewards", "turn_limits", "invalid_actions")
"""The ``env/<name>`` counters of a rollout call, summed over its episodes."""


@dataclass
class EpisodeRecord:
    """What one episode leaves besides its rows: its score's parts and what went wrong."""

    parts: dict[str, float] = field(default_factory=dict)
    turn_limit: bool = False
    invalid_actions: int = 0
    failure: EnvironmentFailure | None = None


def record_stats(records: list[EpisodeRecord]) -> dict[str, Metric]:
    """``env/*`` of some episodes: the counters (:data:`COUNTERS`) and each part's mean over the episodes that
    have it."""
    out: dict[str, Metric] = {
        "env/episodes": Sum(float(len(records))),
        "env/errors": Sum(float(sum(r.failure is not None and not r.failure.bad_reward for r in records))),
        "env/bad_rewards": Sum(float(sum(r.failure is not None and r.failure.bad_reward for r in records))),
        "env/turn_limits": Sum(float(sum(r.turn_limit for r in records))),
        "env/invalid_actions": Sum(float(sum(r.invalid_actions for r in records))),
    }
    names = dict.fromkeys(n for r in records if r.failure is None for n in r.parts)
    for name in names:
        values = [r.parts[name] for r in records if r.failure is None and name in r.parts]
        out[f"env/{name}"] = Mean(sum(values) / len(values), float(len(values)))
    return out


class EnvironmentAgent:
    """``run(data, *, client)`` of a multi-turn environment adapter (``base.py``)."""

    def __init__(self, environment: Any, *, error_value: float = 0.0):
        self.environment, self.error_value = environment, float(error_value)
        self._records: dict[Any, list[EpisodeRecord]] = defaultdict(list)
        self._lock = threading.Lock()

    async def run(self, data: dict, *, client: Any) -> Any:
        record = EpisodeRecord()
        try:
            return await self.environment.episode(data, client, record)
        except EnvironmentFailure as e:
            record.failure = e
            kind = "bad_rewards" if e.bad_reward else "errors"
            warn_once(self.environment.label, kind, f"{e} (row {data.get(KEY)}); the episode scores "
                      f"reward.error_value={self.error_value:g}, counted in env/{kind}; the run goes on unless every "
                      "episode of a rollout fails (this line is not repeated).")
            return self.error_value
        finally:
            if record.turn_limit:
                warn_once(self.environment.label, "turn_limit", f"an episode reached environment.max_turns="
                          f"{self.environment.settings.max_turns} model calls and ended there, scored as it stood "
                          "(counted in env/turn_limits; this line is not repeated).")
            with self._lock:
                self._records[data.get(KEY)].append(record)

    def take(self, key: Any) -> list[EpisodeRecord]:
        """The records of the episodes of row ``key`` since the last call (they are forgotten)."""
        with self._lock:
            return self._records.pop(key, [])
