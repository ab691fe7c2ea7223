"""M2PO second-moment token filter.

M2PO, Second-Moment Trust Policy Optimization (Zheng et al., 2025, "Prosperity before Collapse: How
Far Can Off-Policy RL Reach with Stale Data on LLMs?"), bounds the second moment of
the log importance weight between the behaviour policy and the proximal policy,
``m2_t = (log pi_behav(x_t) - log pi_prox(x_t))^2``, by dropping the fewest, largest-``m2`` tokens
of the micro-batch such that the mean ``m2`` of the remaining tokens is below ``tau``. At least one
token (the smallest) is always kept, so the filter can never empty a non-empty micro-batch.

The search is a single sort plus suffix means (no Python loop, no device synchronisation).
"""

from __future__ import annotations

import torch

from ..errors import number_in


def second_moment(behav_logp: torch.Tensor, prox_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` float32 ``(behav - prox)^2``, detached; 0 outside ``mask``; NaN becomes +inf."""
    m2 = (behav_logp.detach().float() - prox_logp.detach().float()).square()
    # An undefined divergence is treated as the largest possible one, so it is dropped first.
    m2 = torch.nan_to_num(m2, nan=float("inf"))
    return torch.where(mask, m2, 0.0)


def m2po_problems(key: str, *, m2_threshold: float | None) -> list[str]:
    return number_in(f"{key}.m2_threshold", m2_threshold, 0, open_low=True, nullable=True, note="M2PO uses 0.04")


def m2po_mask(
    behav_logp: torch.Tensor, prox_logp: torch.Tensor, mask: torch.Tensor, *, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the k largest-``m2`` tokens, with k the smallest count whose removal brings the mean below ``threshold``.

    Args:
        behav_logp, prox_logp: ``[B, S]`` log pi_behav and log pi_prox.
        mask: ``[B, S]`` bool tokens in the loss.
        threshold: tau_M2 > 0.

    Returns:
        ``(mask, n_masked)``: the reduced bool mask (a subset of ``mask``) and the 0-dim float count of
        removed tokens. If no k < n qualifies, all but the smallest token are removed.
    """
    mask = mask.bool()
    m2 = second_moment(behav_logp, prox_logp, mask).flatten()
    flat_mask = mask.flatten()
    n = flat_mask.sum()
    # Excluded tokens sort after every valid one (m2 >= 0 > -1), so rank < n means valid.
    values, order = torch.sort(torch.where(flat_mask, m2, -1.0), descending=True)
    rank = torch.arange(values.numel(), device=values.device)
    valid_rank = rank < n
    values = torch.where(valid_rank, values, 0.0)
    # suffix_sum[k] = sum of the n - k smallest valid values; their mean decides whether k suffices.
    suffix_sum = values.flip(0).cumsum(0).flip(0)
    suffix_mean = suffix_sum / (n - rank).clamp_min(1)
    qualifies = valid_rank & (suffix_mean < threshold)
    # Smallest qualifying k; n - 1 (keep only the smallest) when none does; -1 (drop none) when n == 0.
    k = torch.where(qualifies, rank, n - 1).amin() if values.numel() else n - 1
    drop_sorted = rank < k
    drop = torch.zeros_like(flat_mask).scatter(0, order, drop_sorted).view_as(mask)
    return mask & ~drop, (mask & drop).sum(dtype=torch.float32)
