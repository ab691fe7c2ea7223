"""Per-row outcome rewards: the overlong penalty, bias/scale/clip, ``reward_norm`` (with logical
rollout references) and placement on each row's last active position.

Every function returns new tensors; the rollout's rewards are never modified.
"""

from __future__ import annotations

import torch

from .datatypes import OutcomeResult, OutcomeRewardInputs, TrajBatchMeta
from .normalize import AllReduce, norm_stats, normalize


def overlong_penalty(
    rewards: torch.Tensor, loss_mask: torch.Tensor, *, max_new_tokens: int, overlong_tokens: int, factor: float
) -> torch.Tensor:
    """DAPO soft overlong punishment, ``[B]`` float32.

    ``L_b`` is the number of generated tokens of row ``b`` (the un-aligned ``loss_mask`` summed, all
    turns together). The penalty is 0 up to ``max_new_tokens - overlong_tokens`` and falls linearly to
    ``-factor`` at ``max_new_tokens``; it is not clamped below, so longer rows are punished further.
    """
    length = loss_mask.float().sum(-1)
    penalty = (-(length - (max_new_tokens - overlong_tokens)) / overlong_tokens * factor).clamp(max=0.0)
    return rewards.float() + penalty


def scale_bias_clip(rewards: torch.Tensor, *, bias: float, scale: float, clip: float) -> torch.Tensor:
    """``clip((r + bias) * scale, -clip, clip)`` as float32 (integer rewards become floats here)."""
    return ((rewards.float() + bias) * scale).clamp(-clip, clip)


def place_outcome(rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]``: each row's reward at its last active aligned position, 0 elsewhere.

    ``loss_mask`` is the aligned float 0/1 mask. A row without an active position gets no reward.
    """
    pos = torch.arange(1, loss_mask.shape[-1] + 1, device=loss_mask.device, dtype=torch.float32)
    placed = torch.empty(loss_mask.shape, dtype=torch.float32, device=loss_mask.device)
    torch.mul(loss_mask, pos, out=placed)  # once its maximum is read, this tensor becomes the output
    last = placed.amax(-1, keepdim=True)  # 1-based; 0 for a row with nothing active
    value = rewards.float()[:, None] * last.clamp(max=1)
    return placed.zero_().scatter_(1, (last - 1).clamp(min=0).long(), value)


def normalize_rewards(
    rewards: torch.Tensor,
    *,
    settings,
    meta: TrajBatchMeta | None,
    references: torch.Tensor | None = None,
    unpenalized: torch.Tensor | None = None,
    all_reduce: AllReduce | None = None,
) -> torch.Tensor:
    """Bias/scale/clip the shaped per-row ``rewards`` ``[B]``, then apply ``cfg.reward_norm``.

    When the batch carries logical rollouts (``meta.rollout_groups``) or shaped ``references`` are
    given, the statistics are taken over one reference per logical rollout (grouped by
    ``meta.logical_group_sizes``) and every row is normalised with its rollout's mean and scale.
    A reference is, in order: ``references[j]``; the explicit reward of ``meta``; the reward of the
    rollout's first row, which requires all its rows to agree (and their ``unpenalized`` rewards too).

    Args:
        rewards: ``[B]`` after the length penalty and the outcome stage.
        settings: ``reward_bias``, ``reward_scaling``, ``reward_clip`` and ``reward_norm`` (``AdvantageSettings``).
        meta: the batch grouping, or None.
        references: ``[L]`` shaped references (one per logical rollout), before bias/scale/clip.
        unpenalized: ``[B]`` rewards before the length penalty (to check split rows), or None.
        all_reduce: data-parallel sum for batch statistics.

    Returns:
        ``[B]`` float32.
    """
    opts = dict(bias=settings.reward_bias, scale=settings.reward_scaling, clip=settings.reward_clip)
    scores = scale_bias_clip(rewards, **opts)
    norm = settings.reward_norm
    if norm is None or (norm.mean_level is None and norm.std_level is None):
        return scores
    sizes = meta.traj_group_sizes if meta is not None else None
    logical = meta is not None and any(g is not None for g in meta.rollout_groups)
    if not logical and references is None:
        return normalize(scores, None, norm, group_sizes=sizes, all_reduce=all_reduce)
    if meta is None:
        raise ValueError("shaped normalization_rewards need the batch's TrajBatchMeta (logical rollout groups); "
                         "the batch has none.")
    counts = torch.tensor(meta.logical_row_counts, device=rewards.device)
    lid = torch.repeat_interleave(torch.arange(counts.numel(), device=rewards.device), counts,
                                  output_size=rewards.shape[0])  # known size: no device sync
    first = counts.cumsum(0) - counts
    if references is None:
        references = _derived_references(rewards, meta, lid, first, unpenalized, norm, all_reduce)
    ref_scores = scale_bias_clip(references, **opts)
    mean, denom = norm_stats(ref_scores, None, norm, group_sizes=meta.logical_group_sizes, all_reduce=all_reduce)
    if norm.std_level is not None:  # a (near) zero spread would blow the rewards up; leave them unscaled
        denom = torch.where(denom <= 2 * norm.eps, 1.0, denom)
    shape = (counts.numel(), 1)
    mean, denom = torch.broadcast_to(mean, shape).reshape(-1), torch.broadcast_to(denom, shape).reshape(-1)
    return ((scores.double() - mean[lid]) / denom[lid]).float()


def _derived_references(rewards, meta, lid, first, unpenalized, norm, all_reduce):
    explicit = meta.logical_rewards
    has = torch.tensor([r is not None for r in explicit], device=rewards.device)
    given = torch.tensor([0.0 if r is None else r for r in explicit], device=rewards.device)
    r = rewards.float()
    differ = r != r[first][lid]
    if unpenalized is not None:
        u = unpenalized.float()
        differ |= u != u[first][lid]
    bad = (differ & ~has[lid]).any().to(torch.float32)
    if all_reduce is not None and "batch" in (norm.mean_level, norm.std_level):
        bad = all_reduce(bad)  # every rank raises together instead of hanging in the next all-reduce
    if float(bad) > 0:
        raise ValueError("Split rollout row rewards differ; supply an explicit rollout_reward for reward "
                         "normalization (RolloutGroup.rewards), or return OutcomeResult.normalization_rewards.")
    return torch.where(has, given, r[first])


def identity(inputs: OutcomeRewardInputs) -> OutcomeResult:
    """The built-in outcome stage: the rewards as they are (an integer dtype is kept)."""
    return OutcomeResult(rewards=inputs.data["rewards"])
