"""How the loss's statistics combine over the micro-batches of a step (:func:`reduce_stats`).

Every statistic is made with its reduction (:class:`~.types.Stat`: ``Stat.mean(x, weight=n_tokens)``,
``Stat.sum``, ``Stat.max``, ``Stat.min``), where it is computed; nothing is read from its name. A user's
surrogate or whole loss may return plain 0-dim tensors instead; :func:`declared` gives them the default:

* ``<namespace>/n_valid_tokens`` (the namespace's token count, e.g. ``actor/n_valid_tokens``): a sum;
* any other key of a namespace that reports ``<namespace>/n_valid_tokens`` in the same stats: the mean
  weighted by that count (a per-token mean of the whole step);
* every other key: the plain mean.

The trainer turns the result into metrics that carry the same reduction across processes
(``train/models/update.py``). Works on device tensors and never synchronises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .masked import masked_mean
from .types import Reduction, Stat, Stats

__all__ = ["Reduction", "Stat", "count_key", "declared", "reduce_stats", "token_mean"]


def token_mean(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor | None = None) -> Stat:
    """The mean of ``x`` over ``mask`` (``[B, S]`` each) as a statistic weighted by its tokens: ``sum(x over mask)
    / count`` with weight ``count`` (default: the tokens of ``mask``). A larger ``count`` (the pre-filter tokens)
    makes it a fraction of that count, weighted by the same."""
    weight = mask.sum(dtype=torch.float32) if count is None else count
    return Stat.mean(masked_mean(x, mask, count), weight=weight)


def count_key(key: str) -> str:
    """The token count a plain value of this namespace is weighted by: ``<namespace>/n_valid_tokens``."""
    return f"{key.split('/', 1)[0]}/n_valid_tokens"


def _tensor(value: Stat | torch.Tensor) -> torch.Tensor:
    return value.value if isinstance(value, Stat) else value


def declared(stats: Mapping[str, Stat | torch.Tensor]) -> Stats:
    """``stats`` with every value a detached :class:`Stat`: a ``Stat`` as it was made, a plain tensor with the
    default of the module docstring (read in ``stats`` itself, where its namespace's count would be)."""
    out: Stats = {}
    for key, value in stats.items():
        if isinstance(value, Stat):
            out[key] = value.detach()
            continue
        count = count_key(key)
        if key == count:
            out[key] = Stat.sum(value.detach())
        elif count in stats:
            out[key] = Stat.mean(value.detach(), weight=_tensor(stats[count]).detach())
        else:
            out[key] = Stat.mean(value.detach())
    return out


def _scalars(values: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([v.detach().float().reshape(()) for v in values])


def _reduce(key: str, stats: Sequence[Stat]) -> Stat:
    """One key's statistics of every micro-batch, combined; every one must be made the same way."""
    kinds = {(s.reduction, s.weight is None) for s in stats}
    if len(kinds) > 1:
        raise ValueError(f"the loss statistic {key!r} was made with different reductions in the micro-batches of "
                         f"one step: {sorted((str(r), 'plain' if w else 'weighted') for r, w in kinds)}; make it "
                         "the same way every time (loss/types.py::Stat).")
    how, values = stats[0].reduction, _scalars([s.value for s in stats])
    if how is Reduction.MIN:
        return Stat.min(values.amin())
    if how is Reduction.MAX:
        return Stat.max(values.amax())
    if how is Reduction.SUM:
        return Stat.sum(values.sum())
    if stats[0].weight is None:
        return Stat.mean(values.mean())
    w = _scalars([s.weight for s in stats])
    # Empty micro-batches report 0 means with weight 0; an all-empty step gives 0.
    return Stat.mean((values * w).sum() / w.sum().clamp_min(1), weight=w.sum())


def reduce_stats(per_micro_batch: Sequence[Mapping[str, Stat | torch.Tensor]]) -> Stats:
    """Combine the stats of several micro-batches (dicts with the same keys) into one dict, each key by the
    reduction it was made with (:func:`declared` for plain tensors). A mean keeps its summed weight."""
    if not per_micro_batch:
        return {}
    each = [declared(s) for s in per_micro_batch]
    return {key: _reduce(key, [s[key] for s in each]) for key in each[0]}
