"""Per-sample rewards from one or more reward sources, with weights, failure handling and counters.

A *source* scores a whole batch: :class:`FunctionReward` (a user function run in a
:class:`~areal_trainer.reward.pool.WorkerPool`) or :class:`~areal_trainer.reward.remote.RemoteReward`
(a scoring service). The sources of one batch run concurrently. A sample's reward is the weighted
sum of its sources' values:

* ``None`` ("not applicable", as in TRL) is left out of the sum and counted (``reward/none``); a
  sample no source applies to gets 0.0 (``reward/all_none``);
* failures follow the run's one failure policy (``areal_trainer/failures.py``, its ``reward`` kind): a call
  that raised, returned NaN/inf or a finite number beyond float32 (``1e39``: infinite in the trainer's
  tensors), or whose worker died scores ``error_value``, one that ran out of time ``timeout_value`` (counted
  in ``reward/errors``, ``reward/nonfinite``, ``reward/out_of_range``, ``reward/worker_deaths``,
  ``reward/timeouts``): one bad sample never stops training; each source's first failure of each kind is
  named once, with its sample; a weighted sum beyond float32 scores ``error_value`` too (``reward/out_of_range``);
* but when more than ``max_error_fraction`` of one batch failed for a source (timeouts aside: they
  depend on the machine's load more than on the function), or it gave no reward for any sample of a batch
  (timeouts included), the function is broken for this data and the run stops with
  :class:`~areal_trainer.errors.UserError`, naming it and showing one example.

Besides the counters, ``reward/<name>`` is each source's mean over the samples it gave a number for;
:meth:`RewardScores.stats` gives all of them for a slice of the batch (one prompt group).
"""

from __future__ import annotations

import asyncio
import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ..dtypes import fits_float32
from ..errors import UserError
from ..failures import FailurePolicy, Notices
from ..metrics import Mean, Metric, Sum
from .dispatch import CallOutcome
from .functions import RewardFunction, RewardSample, classify, sample_of
from .pool import WorkerPool, run_sync

STATUSES = ("ok", "none", "error", "timeout", "died", "nonfinite", "out_of_range")
COUNTERS = ("errors", "timeouts", "worker_deaths", "nonfinite", "out_of_range", "none", "all_none")
_COUNTER_OF = {"error": "errors", "timeout": "timeouts", "died": "worker_deaths", "nonfinite": "nonfinite",
               "out_of_range": "out_of_range", "none": "none"}
_FAILURES = ("error", "died", "nonfinite", "out_of_range")
"""Statuses that count towards ``max_error_fraction``."""
_UNUSABLE = ("nonfinite", "out_of_range")
_HOW = {"error": "raised", "died": "killed their worker process", "nonfinite": "returned NaN or infinity",
        "out_of_range": "returned a number beyond float32, infinite in the trainer's tensors",
        "timeout": "ran out of time"}
"""How the calls of each status failed, in the failure policy's messages."""


class SourceResult(NamedTuple):
    """One source's scores for a batch: per sample a value (a float when ``ok``), a status, a detail; optionally
    named parts of the value per sample (an environment's reward functions), logged as means under their names."""

    values: list[float | None]
    status: list[str]
    details: list[str]
    parts: dict[str, list[float | None]] | None = None

    @classmethod
    def from_values(cls, values: Sequence[Any], label: str) -> SourceResult:
        """Classify plain results (numbers or None); anything else is a :class:`UserError`."""
        for v in values:
            if v is not None and not isinstance(v, numbers.Real):
                raise UserError(f"reward source {label} gave {v!r:.200} ({type(v).__name__}); a reward must be a "
                                "number or None.")
        return _collect(("none", None, "") if v is None else _row(*classify(v)) for v in values)


class RewardSource(Protocol):
    name: str
    """Metric name: ``reward/<name>``."""

    async def score(self, samples: list[RewardSample]) -> SourceResult | list[float | None]: ...


class FunctionReward:
    """A bound :class:`RewardFunction` run in a :class:`WorkerPool`: per sample one call; a batched
    function once per chunk (``chunks``, default one per worker, so the workers share the batch)."""

    def __init__(self, fn: RewardFunction, *, workers: int = 1, timeout: float | None = 30.0,
                 chunks: int | None = None, pool: WorkerPool | None = None):
        self.fn, self.name, self.label = fn, fn.name, fn.path
        self.pool = pool if pool is not None else WorkerPool(workers, timeout=timeout, name=f"areal-reward-{fn.name}")
        self._owns_pool = pool is None
        self.chunks = max(1, chunks or self.pool.workers)

    async def score(self, samples: list[RewardSample]) -> SourceResult:
        if self.fn.style == "sample":
            outcomes = await self.pool.amap(self.fn.path, [self.fn.sample_call(s) for s in samples])
            return _collect(self._checked(o) for o in outcomes)
        parts = _split(samples, self.chunks)
        outcomes = await self.pool.amap(self.fn.path, [self.fn.batch_call(p) for p in parts])
        rows = []
        for part, outcome in zip(parts, outcomes):
            if outcome.status == "ok":
                checked = self.fn.check_batch(outcome.value, len(part))
                rows += [_row(status, value) for status, value in checked]
            else:
                rows += [(outcome.status, None, outcome.detail)] * len(part)
        return _collect(rows)

    def _checked(self, outcome: CallOutcome) -> tuple[str, float | None, str]:
        if outcome.status != "ok":
            return outcome.status, None, outcome.detail
        return _row(*self.fn.check(outcome.value))

    def close(self) -> None:
        if self._owns_pool:
            self.pool.close()


def _row(status: str, value: float | None) -> tuple[str, float | None, str]:
    if status in _UNUSABLE:
        return status, None, f"returned {value!r:.100}"
    return status, value, ""


def _collect(rows) -> SourceResult:
    out = SourceResult([], [], [])
    for status, value, detail in rows:
        out.status.append(status)
        out.values.append(value)
        out.details.append(detail)
    return out


def _split(items: list, parts: int) -> list[list]:
    """``items`` in at most ``parts`` contiguous slices of near-equal length (none empty)."""
    parts = min(parts, len(items)) or 1
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        out.append(items[start:end])
        start = end
    return out


@dataclass
class RewardScores:
    """A batch's rewards, with per-sample counters (how many sources failed in each way on each
    sample) and each source's value per sample (None where it gave no number)."""

    rewards: list[float]
    errors: list[int]
    timeouts: list[int]
    worker_deaths: list[int]
    nonfinite: list[int]
    out_of_range: list[int]
    none: list[int]
    all_none: list[int]
    values: dict[str, list[float | None]] = field(default_factory=dict)
    parts: dict[str, list[float | None]] = field(default_factory=dict)
    """Named parts of the sources' values by metric name (``env/<name>``), per sample (None where none)."""

    @classmethod
    def empty(cls, n: int, names: Sequence[str]) -> RewardScores:
        return cls([0.0] * n, *([0] * n for _ in COUNTERS), values={name: [None] * n for name in names})

    def stats(self, lo: int = 0, hi: int | None = None) -> dict[str, float]:
        """Counters summed over samples ``lo:hi`` (``reward/errors``...), ``reward/<name>``, each
        source's mean over those of them it gave a number for (absent when none)."""
        return {k: float(v.value) for k, v in self.typed(lo, hi).items()}

    def metrics(self) -> dict[str, float]:
        """:meth:`stats` of the whole batch."""
        return self.stats()

    def typed(self, lo: int = 0, hi: int | None = None) -> dict[str, Metric]:
        """:meth:`stats` of samples ``lo:hi`` as metrics that combine over groups and processes: the counters
        add up, each source's mean is weighted by the samples it gave a number for."""
        out: dict[str, Metric] = {f"reward/{c}": Sum(float(sum(getattr(self, c)[lo:hi]))) for c in COUNTERS}
        named = {**{f"reward/{name}": values for name, values in self.values.items()}, **self.parts}
        for key, values in named.items():
            numbers_ = [v for v in values[lo:hi] if v is not None]
            if numbers_:
                out[key] = Mean(sum(numbers_) / len(numbers_), len(numbers_))
        return out


class RewardService:
    """Combine reward sources into per-sample rewards (see the module docs)."""

    def __init__(self, sources: list, *, weights: list[float] | None = None, failures: FailurePolicy | None = None,
                 error_value: float | None = None, timeout_value: float | None = None,
                 max_error_fraction: float | None = None):
        if not sources:
            raise ValueError("RewardService needs at least one reward source")
        if weights is not None and len(weights) != len(sources):
            raise ValueError(f"{len(weights)} weights for {len(sources)} reward sources; give one weight per source")
        values = {k: v for k, v in dict(error_value=error_value, timeout_value=timeout_value,
                                        max_error_fraction=max_error_fraction).items() if v is not None}
        if failures is not None and values:
            raise ValueError(f"give either failures or {', '.join(values)}: the policy holds them")
        # Without a policy, the sources carry their own time limits (``FunctionReward(timeout=...)``).
        self.failures = failures if failures is not None else FailurePolicy.of(reward_timeout=None, **values)
        """The run's failure policy; this service keeps its ``reward`` kind."""
        self.sources = list(sources)
        self.weights = [1.0] * len(sources) if weights is None else [float(w) for w in weights]
        self.names = unique_names([s.name for s in self.sources])
        self._notices = Notices()

    error_value = property(lambda self: self.failures.reward.error_value)  # the policy's reward kind holds them
    timeout_value = property(lambda self: self.failures.reward.timeout_value)

    def score(self, samples: Sequence[RewardSample]) -> RewardScores:
        """:meth:`ascore` from synchronous code (also from a thread that runs an event loop)."""
        return run_sync(lambda: self.ascore(samples))

    def score_completions(self, rows: Sequence[Mapping[str, Any]], completions: Sequence[str]) -> RewardScores:
        """Score each completion text against its dataset row (a sample of ``data/datasets.py``: ``prompt``,
        ``answer``, ``fields``); a conversational row's completion is given as the assistant's message."""
        return self.score([sample_of(row, text) for row, text in zip(rows, completions)])

    async def ascore(self, samples: Sequence[RewardSample]) -> RewardScores:
        samples = list(samples)
        scores = RewardScores.empty(len(samples), self.names)
        if not samples:
            return scores
        results = await self._gather(samples)
        for source, result in zip(self.sources, results):
            self._check_failures(source, result, samples)
        for name, weight, result in zip(self.names, self.weights, results):
            self._add(scores, name, weight, result)
        for source, result in zip(self.sources, results):
            self._name_failures(source, result, samples)
        for i, total in enumerate(scores.rewards):
            if not fits_float32(total):  # each value in range, their weighted sum is not
                scores.rewards[i] = self.error_value
                scores.out_of_range[i] += 1
        for i, none in enumerate(scores.none):
            if none == len(self.sources):  # no source applies to this sample
                scores.all_none[i], scores.rewards[i] = 1, 0.0
        return scores

    async def _gather(self, samples: list[RewardSample]) -> list[SourceResult]:
        tasks = [asyncio.ensure_future(s.score(samples)) for s in self.sources]
        try:
            raw = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:  # one source failed the run: stop the others rather than let them run on
                t.cancel()
            raise
        return [self._normalize(s, r, len(samples)) for s, r in zip(self.sources, raw)]

    @staticmethod
    def _normalize(source, result, n: int) -> SourceResult:
        label = getattr(source, "label", source.name)
        if not isinstance(result, SourceResult):
            if not isinstance(result, (list, tuple)):
                raise UserError(f"reward source {label} returned a {type(result).__name__}; expected a list of "
                                "rewards (numbers or None), one per sample.")
            result = SourceResult.from_values(result, label)
        if not len(result.values) == len(result.status) == len(result.details) == n:
            raise UserError(f"reward source {label} gave {len(result.status)} results for {n} samples; it must "
                            "give one per sample, in order.")
        unknown = set(result.status) - set(STATUSES)
        if unknown:
            raise ValueError(f"reward source {label} reported the unknown status(es) {sorted(unknown)}")
        return result

    def _policy(self, source):
        """The reward kind's policy; a source whose own ``max_error_fraction`` is None stops only when all failed."""
        own = hasattr(source, "max_error_fraction") and source.max_error_fraction is None
        return dataclasses.replace(self.failures.reward, max_error_fraction=None) if own else self.failures.reward

    def _check_failures(self, source, result: SourceResult, samples: list[RewardSample]) -> None:
        """The policy's stop rules: too many failures in one batch, or no reward for any sample of it."""
        policy, label = self._policy(source), getattr(source, "label", source.name)
        failed = [i for i, st in enumerate(result.status) if st in _FAILURES]
        policy.check_some_result(label, total=len(samples), timeouts=result.status.count("timeout"),
                                 failed=len(failed), change=f"make the function faster, raise {policy.timeout_key}, "
                                                            "or give it more reward.workers.")
        if not (len(failed) == len(samples) > 0 if (own := policy.max_error_fraction is None)
                else policy.too_many(len(failed), len(samples))):
            return
        counts = {st: result.status.count(st) for st in _FAILURES}
        i = failed[0]
        beyond = f", {counts['out_of_range']} a number beyond float32" if counts["out_of_range"] else ""
        raise policy.stop(
            label, failed=len(failed), total=len(samples),
            ways=f"{counts['error']} raised, {counts['died']} killed their worker process, {counts['nonfinite']} "
                 f"returned NaN or infinity{beyond}",
            example=f"completion={_excerpt(samples[i].completion)!r}, answer={_excerpt(samples[i].answer, 100)!r} -> "
                    f"{result.details[i]}",
            change="Fix the source (or its environment.kwargs)." if own else "Fix the function (reward.workers=0 "
            f"runs it in the trainer, for a debugger), or raise {policy.fraction_key}.")

    def _name_failures(self, source, result: SourceResult, samples: list[RewardSample]) -> None:
        """Name each source's first failure of each kind once (then it is only counted)."""
        label = getattr(source, "label", source.name)
        for status, how in _HOW.items():
            if status in result.status:
                i = result.status.index(status)
                self._notices.name(self._policy(source), label, count=result.status.count(status), total=len(samples),
                                   how=how, counter=_COUNTER_OF[status],
                                   example=f"completion={_excerpt(samples[i].completion, 80)!r} -> {result.details[i]}")

    def _add(self, scores: RewardScores, name: str, weight: float, result: SourceResult) -> None:
        scored = scores.values[name]
        for key, values in (result.parts or {}).items():
            scores.parts[key] = list(values)
        for i, (status, value) in enumerate(zip(result.status, result.values)):
            if status == "ok":
                scores.rewards[i] += weight * value
                scored[i] = value
            elif status == "timeout":
                scores.rewards[i] += weight * self.timeout_value
            elif status != "none":
                scores.rewards[i] += weight * self.error_value
            if status != "ok":
                getattr(scores, _COUNTER_OF[status])[i] += 1

    def close(self) -> None:
        """Stop every source's workers (sources without ``close`` are left alone)."""
        for source in self.sources:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> RewardService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def unique_names(names: list[str]) -> list[str]:
    """Source names as metric names: a name taken by a counter or an earlier source gets ``_2``, ``_3``..."""
    taken, out = set(COUNTERS), []
    for name in names:
        unique, k = name, 1
        while unique in taken:
            k += 1
            unique = f"{name}_{k}"
        taken.add(unique)
        out.append(unique)
    return out


def _excerpt(value: Any, limit: int = 200) -> Any:
    """The text of a completion (chat messages: their contents), cut to ``limit`` characters."""
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        value = "\n".join(str(m.get("content", "")) for m in value)
    return value[:limit] if isinstance(value, str) else value
