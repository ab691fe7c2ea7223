"""Metric values that carry their own reduction.

A step's metrics are made on every data-parallel rank (and, inside the update, on every micro-batch)
and must be combined into one record. How depends on what the number is, and that is known where
it is created, not from its name: ``rollout/rows`` adds up over ranks, ``update/grad_norm`` is the
same on every rank, a per-token mean is weighted by its tokens. So every value is created as one of

* :class:`Mean` (optionally weighted: ``Mean(x, weight=n_tokens)``): the weighted mean;
* :class:`Sum`: counts and totals;
* :class:`Max` / :class:`Min`: extremes;

and :func:`reduce` combines records key by key by the type of the values (a key some records lack
is combined over the others). :func:`floats` turns a record into plain numbers for the metrics file
and wandb. Plain ``float`` values are accepted where a record is built and count as ``Mean``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """A number and how it combines with others of its key (see the subclasses)."""

    value: float

    @classmethod
    def combine(cls, items: Sequence[Metric]) -> Metric:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass(frozen=True)
class Mean(Metric):
    """A (weighted) mean: combined as ``sum(value * weight) / sum(weight)``; all weights 0 give 0."""

    weight: float = 1.0

    @classmethod
    def combine(cls, items: Sequence[Metric]) -> Mean:
        total = sum(float(m.weight) for m in items)  # type: ignore[attr-defined]
        if total <= 0:
            return Mean(0.0, 0.0)
        return Mean(sum(float(m.value) * float(m.weight) for m in items) / total, total)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Sum(Metric):
    """A count or total: combined by adding."""

    @classmethod
    def combine(cls, items: Sequence[Metric]) -> Sum:
        return Sum(sum(float(m.value) for m in items))


@dataclass(frozen=True)
class Max(Metric):
    @classmethod
    def combine(cls, items: Sequence[Metric]) -> Max:
        return Max(max(float(m.value) for m in items))


@dataclass(frozen=True)
class Min(Metric):
    @classmethod
    def combine(cls, items: Sequence[Metric]) -> Min:
        return Min(min(float(m.value) for m in items))


Record = Mapping[str, "Metric | float"]


def as_metric(value: Metric | float) -> Metric:
    return value if isinstance(value, Metric) else Mean(float(value))


def reduce(records: Sequence[Record]) -> dict[str, Metric]:
    """Combine records (one per rank or micro-batch) key by key; every value of a key must be of one type."""
    out: dict[str, Metric] = {}
    keys = dict.fromkeys(k for r in records for k in r)
    for key in keys:
        items = [as_metric(r[key]) for r in records if key in r]
        if len(items) == 1:  # nothing to combine: the value stays exactly as it was made
            out[key] = items[0]
            continue
        kinds = {type(m) for m in items}
        if len(kinds) > 1:
            raise TypeError(f"metric {key!r} was created as {sorted(k.__name__ for k in kinds)} on different ranks")
        out[key] = kinds.pop().combine(items)
    return out


def floats(record: Record) -> dict[str, float]:
    """The plain numbers of a record (what the metrics file and wandb receive)."""
    return {k: float(v.value) if isinstance(v, Metric) else float(v) for k, v in record.items()}
