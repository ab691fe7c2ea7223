"""A single-turn environment's scoring as a reward source of the reward service (``reward/service.py``): the
source ``environment`` (``reward.fn`` names it, by default with an environment), scoring every answer of a batch
concurrently, in this process, with the environment's own scoring (``score(fields, completion)`` of the adapter).

Each answer's outcome is the service's: ``ok`` with the environment's reward, ``timeout`` past
``reward.timeout`` seconds, ``error`` when the environment failed (raised, or returned something that is not a
number), ``nonfinite`` / ``out_of_range`` for NaN, infinity or a number beyond float32; the counters are the
service's (``reward/errors``...), and the first failure of each kind is named in one line. The score's parts (a
verifiers task's reward functions, one by one) are ``env/<name>``. Unlike a reward function, whose failures on
more than ``reward.max_error_fraction`` of a batch stop the run, the environment stops it only when it failed on
every answer of a batch (:attr:`EnvironmentReward.max_error_fraction` is None).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..reward import completion_text
from ..reward.functions import RewardSample
from ..reward.service import SourceResult
from .base import EnvironmentFailure, describe, warn_once

NAME = "environment"
"""The source's name in ``reward.fn`` and its metric, ``reward/environment``."""


class EnvironmentReward:
    """The reward source of a single-turn environment adapter (see the module docstring)."""

    name = NAME
    max_error_fraction = None
    """The service stops the run only when this source failed on every answer of a batch."""

    def __init__(self, environment: Any, *, timeout: float | None = 30.0):
        self.environment, self.timeout = environment, timeout
        self.label = f"environment {environment.label}"

    async def score(self, samples: list[RewardSample]) -> SourceResult:
        outcomes = await asyncio.gather(*(self._one(s) for s in samples))
        out = SourceResult([], [], [], {})
        for i, (status, value, detail, parts) in enumerate(outcomes):
            out.status.append(status)
            out.values.append(value)
            out.details.append(detail)
            for name, part in parts.items():
                out.parts.setdefault(f"env/{name}", [None] * len(samples))[i] = part
        return out

    async def _one(self, sample: RewardSample) -> tuple[str, float | None, str, dict]:
        env = self.environment
        try:
            score = await asyncio.wait_for(env.score(dict(sample.fields), completion_text(sample.completion)),
                                           self.timeout)
        except TimeoutError:
            return "timeout", None, f"took longer than reward.timeout={self.timeout:g} s", {}
        except EnvironmentFailure as e:
            status = "nonfinite" if e.bad_reward and "finite" in e.detail else "error"
            warn_once(env.label, status, f"{e}; the answer scores reward.error_value (counted in reward/"
                      f"{'nonfinite' if status == 'nonfinite' else 'errors'}); the run goes on unless the environment "
                      "fails on every answer of a batch (this line is not repeated).")
            return status, None, str(e), {}
        except Exception as e:  # noqa: BLE001 - anything else the environment's code raised
            warn_once(env.label, "error", f"scoring raised {describe(e)}; the answer scores reward.error_value "
                      "(counted in reward/errors; this line is not repeated).")
            return "error", None, describe(e), {}
        return "ok", score.reward, "", score.parts
