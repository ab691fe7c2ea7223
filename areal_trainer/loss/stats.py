"""Reduction of per-micro-batch loss stats into per-step stats (the convention of the package docstring).

* keys ending in ``/min`` or ``/max``: minimum / maximum;
* keys ending in ``n_valid_tokens`` or ``loss/normalizer``: sum;
* every other key: mean weighted by the ``<namespace>/n_valid_tokens`` of the same micro-batch
  (``<namespace>`` is the key's first path segment), or a plain mean if there is no such count.

Works on device tensors and never synchronises; the same rule applies across data-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .types import Stats

SUM_SUFFIXES = ("n_valid_tokens", "loss/normalizer")


def reduction_of(key: str) -> str:
    """``min``, ``max``, ``sum`` or ``mean``: how ``key`` combines across micro-batches."""
    if key.endswith("/min"):
        return "min"
    if key.endswith("/max"):
        return "max"
    if key.endswith(SUM_SUFFIXES):
        return "sum"
    return "mean"


def reduce_stats(per_micro_batch: Sequence[Stats]) -> Stats:
    """Combine the stats of several micro-batches (dicts with the same keys) into one dict."""
    if not per_micro_batch:
        return {}
    out: Stats = {}
    for key in per_micro_batch[0]:
        values = torch.stack([s[key].detach().float().reshape(()) for s in per_micro_batch])
        how = reduction_of(key)
        if how == "min":
            out[key] = values.amin()
        elif how == "max":
            out[key] = values.amax()
        elif how == "sum":
            out[key] = values.sum()
        else:
            count_key = f"{key.split('/', 1)[0]}/n_valid_tokens"
            if count_key in per_micro_batch[0]:
                w = torch.stack([s[count_key].detach().float().reshape(()) for s in per_micro_batch])
                # Empty micro-batches report 0 means with weight 0; an all-empty step gives 0.
                out[key] = (values * w).sum() / w.sum().clamp_min(1)
            else:
                out[key] = values.mean()
    return out
