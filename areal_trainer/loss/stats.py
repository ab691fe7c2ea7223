"""How the loss's statistics combine over the micro-batches of a step (:func:`reduce_stats`): one table,
the loss package's own naming convention (the trainer turns the result into metrics that carry the
same reduction across processes, ``train/models/update.py``).

* keys ending in ``/min`` or ``/max``: minimum / maximum;
* counts (keys ending in one of :data:`SUM_SUFFIXES`): sum;
* a key whose namespace (its first path segment) reports ``<namespace>/n_valid_tokens`` alongside it:
  the mean weighted by that token count (a per-token mean of the whole step);
* every other key: the plain mean.

Works on device tensors and never synchronises.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import StrEnum

import torch

from .types import Stats


class Reduction(StrEnum):
    MIN = "min"
    MAX = "max"
    SUM = "sum"
    TOKEN_MEAN = "token_mean"
    MEAN = "mean"


SUM_SUFFIXES = ("n_valid_tokens", "/normalizer")
"""The loss's counts: they add up over micro-batches."""


def count_key(key: str) -> str:
    """The token count a key of this namespace is weighted by: ``<namespace>/n_valid_tokens``."""
    return f"{key.split('/', 1)[0]}/n_valid_tokens"


def reduction_of(key: str, present: Collection[str] = ()) -> Reduction:
    """How ``key`` combines, given the other keys ``present`` in the same record."""
    if key.endswith("/min"):
        return Reduction.MIN
    if key.endswith("/max"):
        return Reduction.MAX
    if key.endswith(SUM_SUFFIXES):
        return Reduction.SUM
    if count_key(key) in present:
        return Reduction.TOKEN_MEAN
    return Reduction.MEAN


def reduce_stats(per_micro_batch: Sequence[Stats]) -> Stats:
    """Combine the stats of several micro-batches (dicts with the same keys) into one dict."""
    if not per_micro_batch:
        return {}
    keys = per_micro_batch[0]
    out: Stats = {}
    for key in keys:
        values = torch.stack([s[key].detach().float().reshape(()) for s in per_micro_batch])
        how = reduction_of(key, keys)
        if how is Reduction.MIN:
            out[key] = values.amin()
        elif how is Reduction.MAX:
            out[key] = values.amax()
        elif how is Reduction.SUM:
            out[key] = values.sum()
        elif how is Reduction.TOKEN_MEAN:
            w = torch.stack([s[count_key(key)].detach().float().reshape(()) for s in per_micro_batch])
            # Empty micro-batches report 0 means with weight 0; an all-empty step gives 0.
            out[key] = (values * w).sum() / w.sum().clamp_min(1)
        else:
            out[key] = values.mean()
    return out
