"""Clipped value loss of the PPO critic (arXiv:1707.06347, with the value clipping of OpenAI baselines).

``v_clip = v_old + clamp(v - v_old, -eps, eps)`` and ``l = max((v - R)^2 / 2, (v_clip - R)^2 / 2)``:
the new value may move at most ``eps`` (absolute units) away from the value the returns were
computed with before the pessimistic branch takes over. Aggregated as a token mean with the same
global-normaliser convention as the policy loss (:mod:`areal_trainer.loss.aggregate`).
"""

from __future__ import annotations

import torch

from .aggregate import Normalizer, aggregate_loss, loss_normalizer
from .masked import masked_mean
from .stats import declared, token_mean
from .types import Stat, Stats

EV_EPS = 1e-8
"""Return variance below which the explained variance is reported as 0 (it is undefined)."""


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, *,
                       all_reduce=None) -> torch.Tensor:
    """0-dim ``1 - Var(target - pred) / Var(target)`` over ``mask`` (bool or 0/1); 0 when Var(target) is ~0.

    ``all_reduce`` (sums a tensor over the data-parallel processes): the variances are those of every process's
    tokens together, from summed moments, so two processes report what one would on the whole batch."""
    mask = mask.bool()
    if all_reduce is None:
        n = mask.sum().clamp_min(1)
        resid = target - pred
        target_var = masked_mean((target - masked_mean(target, mask, n)).square(), mask, n)
        resid_var = masked_mean((resid - masked_mean(resid, mask, n)).square(), mask, n)
    else:
        t, r = target.double(), (target - pred).double()
        sums = torch.stack([mask.sum().double(), *(torch.where(mask, x, 0.0).sum() for x in (t, t * t, r, r * r))])
        n, st, stt, sr, srr = all_reduce(sums).unbind()
        n = n.clamp_min(1)
        target_var = (stt / n - (st / n).square()).clamp_min(0).float()
        resid_var = (srr / n - (sr / n).square()).clamp_min(0).float()
    ev = 1.0 - resid_var / target_var.clamp_min(EV_EPS)
    return torch.where(target_var > EV_EPS, ev, 0.0)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_clip: float,
    normalizer: Normalizer | None = None,
) -> tuple[torch.Tensor, Stats]:
    """Clipped value loss, computed in float32.

    Args:
        values: ``[B, S]`` new value predictions (carry the gradient).
        old_values: ``[B, S]`` values the advantages and returns were computed with.
        returns: ``[B, S]`` value targets.
        loss_mask: ``[B, S]`` bool or 0/1, the positions trained on.
        eps_clip: absolute clip range of the value change (> 0).
        normalizer: global number of loss tokens of the optimizer step, or None for the local count.

    Returns:
        ``(loss, stats)``: 0-dim loss and detached statistics under ``critic/``, each made with its
        reduction (``types.py::Stat``): the token means ``value_loss`` (of the clipped loss),
        ``clip_frac`` (tokens whose clipped branch is larger), ``explained_variance`` (of the returns by
        the old values; per micro-batch, weighted by its tokens), ``value/mean``, ``old_value/mean``,
        ``return/mean``, ``return/sq_mean``, ``residual/mean``, ``residual/sq_mean`` (residual =
        returns - old values; from these the step-level explained variance can be recomputed exactly),
        the sums ``n_valid_tokens`` and ``loss/normalizer`` (local count), and the maximum
        ``loss/normalizer_used/max``.
    """
    if not eps_clip > 0:
        raise ValueError(f"value eps_clip must be > 0; got {eps_clip}.")
    shape = values.shape
    for name, t in (("old_values", old_values), ("returns", returns), ("loss_mask", loss_mask)):
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)} like values.")
    mask = loss_mask.bool()
    v = torch.where(mask, values.float(), 0.0)
    v_old = torch.where(mask, old_values.detach().float(), 0.0)
    ret = torch.where(mask, returns.detach().float(), 0.0)
    v_clip = v_old + (v - v_old).clamp(-eps_clip, eps_clip)
    plain = 0.5 * (v - ret).square()
    clipped = 0.5 * (v_clip - ret).square()
    token_loss = torch.maximum(plain, clipped)
    loss, norm_used = aggregate_loss(token_loss, mask, mode="token-mean", normalizer=normalizer)

    n_valid = mask.sum(dtype=torch.float32)
    resid = ret - v_old
    with torch.no_grad():
        stats = {
            "critic/value_loss": token_mean(token_loss, mask, n_valid),
            "critic/clip_frac": token_mean((clipped > plain).float(), mask, n_valid),
            # per micro-batch, weighted by its tokens like the means it could be recomputed from
            "critic/explained_variance": Stat.mean(explained_variance(v_old, ret, mask), weight=n_valid),
            "critic/value/mean": token_mean(v, mask, n_valid),
            "critic/old_value/mean": token_mean(v_old, mask, n_valid),
            "critic/return/mean": token_mean(ret, mask, n_valid),
            "critic/return/sq_mean": token_mean(ret.square(), mask, n_valid),
            "critic/residual/mean": token_mean(resid, mask, n_valid),
            "critic/residual/sq_mean": token_mean(resid.square(), mask, n_valid),
            "critic/n_valid_tokens": Stat.sum(n_valid),
            "critic/loss/normalizer": Stat.sum(loss_normalizer(mask, "token-mean")),
            "critic/loss/normalizer_used/max": Stat.max(norm_used),
        }
    return loss, declared(stats)
