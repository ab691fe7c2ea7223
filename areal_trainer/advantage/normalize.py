"""Mean/std normalisation of rewards (``[B]``) or advantages (``[B, S]``) by ``NormConfig``.

``out = (x - mean) * mask / (std + eps)`` with statistics over the batch, over groups of rows (the
rows of one prompt), or none, independently for the mean and the std. Statistics are computed in
float64 over valid elements (token-weighted for ``[B, S]``); the output is float32.

* Group boundaries come from ``group_sizes`` (rows per prompt, e.g. ``meta.traj_group_sizes``);
  without them the fixed ``group_size`` stride is the fallback and must divide the batch.
* Group statistics are segment sums (``index_add``) with no loop over groups and no host sync.
* Batch statistics are summed with ``all_reduce`` (the data-parallel sum; identity when None):
  one call for ``[count, sum]`` and one for the sum of squares around the reduced mean.
* Leave-one-out: each element is centred by the mean of the others. A group with a single member
  (``member_counts``) uses the element itself, so it comes out 0; its std is 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

AllReduce = Callable[[torch.Tensor], torch.Tensor]

NORM_LEVELS = ("batch", "group", None)
"""Where a mean or std comes from: the whole batch, a prompt's group of rows, or nowhere (null)."""


def group_index(
    n_rows: int, group_sizes: Sequence[int] | None, group_size: int, device: torch.device
) -> tuple[torch.Tensor, list[int]]:
    """``([B] group id of every row, sizes)`` from explicit sizes, else from a fixed stride."""
    if group_sizes is not None:
        sizes = [int(s) for s in group_sizes]
        if any(s <= 0 for s in sizes):
            raise ValueError(f"group_sizes must be all positive (one entry per prompt group); got {sizes}.")
        if sum(sizes) != n_rows:
            raise ValueError(f"group_sizes sum ({sum(sizes)}) must equal batch size ({n_rows}).")
    else:
        if group_size < 1 or n_rows % group_size:
            raise ValueError(f"group normalisation without group metadata needs the batch ({n_rows} rows) to "
                             f"be whole groups of group_size={group_size}; pass the batch's TrajBatchMeta "
                             "(traj_group_sizes) or fix group_size.")
        sizes = [group_size] * (n_rows // group_size)
    gid = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long))
    return gid.to(device), sizes


def norm_stats(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    cfg,
    *,
    group_sizes: Sequence[int] | None = None,
    member_counts: Sequence[int] | None = None,
    all_reduce: AllReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element ``(mean, denominator)`` in float64, broadcastable to ``x``'s shape.

    Args:
        x: ``[B]`` or ``[B, S]``.
        mask: same shape as ``x`` (1 = valid), or None for all valid.
        cfg: a ``NormConfig``.
        group_sizes: rows per group (sum ``B``), or None for the ``cfg.group_size`` stride.
        member_counts: members per group (rows or logical rollouts) deciding the singleton rules;
            defaults to ``group_sizes``.
        all_reduce: sums a tensor over the data-parallel group.
    """
    _, _, mean, denom = _stats(x, mask, cfg, group_sizes, member_counts, all_reduce)
    return mean, denom


def _stats(x, mask, cfg, group_sizes, member_counts, all_reduce):
    """``(x, mask, mean, denominator)``, the first two as ``[B, -1]`` float64."""
    reduce = all_reduce or (lambda t: t)
    n_rows = x.shape[0]
    x2 = x.double().reshape(n_rows, -1)
    m = torch.ones_like(x2) if mask is None else mask.double().reshape(n_rows, -1)
    row_n, row_s = m.sum(-1), (x2 * m).sum(-1)
    grouped = cfg.mean_level == "group" or cfg.std_level == "group"
    if grouped:
        gid, sizes = group_index(n_rows, group_sizes, cfg.group_size, x.device)
        members = torch.tensor(list(member_counts) if member_counts is not None else sizes, device=x.device)
        if members.numel() != len(sizes):
            raise ValueError(f"member_counts has {members.numel()} entries for {len(sizes)} groups.")
        single = (members == 1)[gid][:, None]
        g_n = torch.zeros(len(sizes), dtype=x2.dtype, device=x.device).index_add_(0, gid, row_n)[gid][:, None]
    batch_n = None
    if cfg.mean_level is None:
        mean = torch.zeros((), dtype=x2.dtype, device=x.device)
    elif cfg.mean_level == "batch":
        batch_n, total = reduce(torch.stack([row_n.sum(), row_s.sum()]))
        mean = _mean(x2, m, total, batch_n, cfg.mean_leave1out)
    else:
        g_s = torch.zeros_like(g_n[:, 0]).index_add_(0, gid, row_s)[gid][:, None]
        mean = _mean(x2, m, g_s, g_n, cfg.mean_leave1out)
        if cfg.mean_leave1out:  # a lone member is its own baseline
            mean = torch.where(single, x2, mean)
    centred = (x2 - mean) * m
    sq = centred.square().sum(-1)
    if cfg.std_level is None:
        std, eps = torch.ones((), dtype=x2.dtype, device=x.device), 0.0
    elif cfg.std_level == "batch":
        if batch_n is None:
            batch_n, q = reduce(torch.stack([row_n.sum(), sq.sum()]))
        else:
            q = reduce(sq.sum())
        std, eps = _std(q, batch_n, cfg.std_unbiased), cfg.eps
    else:
        g_q = torch.zeros_like(g_n[:, 0]).index_add_(0, gid, sq)[gid][:, None]
        std, eps = torch.where(single, 1.0, _std(g_q, g_n, cfg.std_unbiased)), cfg.eps
    return x2, m, mean, std + eps


def _mean(x, m, total, n, leave_one_out):
    if not leave_one_out:
        return torch.where(n > 0, total / n.clamp(min=1), 0.0)
    # (sum - x) / (n - 1) at valid elements; the plain mean at masked ones (zeroed later anyway).
    loo = (total - x * m) / (n - m).clamp(min=1)
    return torch.where(n > 1, loo, 0.0)


def _std(q, n, unbiased):
    if unbiased:
        return torch.where(n > 1, (q / (n - 1).clamp(min=1)).sqrt(), 1.0)
    return torch.where(n > 0, (q / n.clamp(min=1)).sqrt(), 1.0)


def normalize(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    cfg,
    *,
    group_sizes: Sequence[int] | None = None,
    member_counts: Sequence[int] | None = None,
    all_reduce: AllReduce | None = None,
) -> torch.Tensor:
    """``(x - mean) * mask / (std + eps)`` as float32, ``x``'s shape (see :func:`norm_stats`).

    With a mask that has no valid element on this rank, ``x`` is returned unchanged (as float32).
    Every rank still takes part in the batch all-reduces.
    """
    x2, m, mean, denom = _stats(x, mask, cfg, group_sizes, member_counts, all_reduce)
    out = ((x2 - mean) * m / denom).reshape(x.shape).float()
    if mask is None:
        return out
    # Nothing valid here: out is all zeros, so adding x back returns the input unchanged.
    return out + x.float() * (m.sum() == 0)
