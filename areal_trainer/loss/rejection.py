"""Rejection sampling between the proximal and the behaviour policy (decoupled PPO only).

Asynchronous rollouts are sampled by an inference engine whose numerics and weights lag the
trainer. Per token the behaviour importance weight ``w = pi_prox / pi_behav`` corrects for that;
this module measures how far the two policies diverge and either drops (``mask``) or bounds
(``clamp``) the units that diverge too much:

* IcePop: ``{level: token, action: mask, metric: ratio, lower: 0.5, upper: 5}``, a band on ``w``.
* KPop: ``{level: token, action: mask, metric: binary_kl, upper: phi}``. Each token's probability
  is read as a Bernoulli parameter and the token is dropped when
  ``max(KL(p || q), KL(q || p)) > phi`` with ``p = pi_prox(x_t)``, ``q = pi_behav(x_t)``.
* The ``kl_k1/k2/k3`` metrics are the per-token KL estimators of :mod:`areal_trainer.loss.kl`.

Bounds are inclusive: a unit is kept iff ``lower <= metric <= upper`` (``lower`` optional). At
sequence level every token of a row shares the decision, taken on the row's aggregate (``sum``,
``mean`` or ``max`` over its masked tokens; the ratio metric aggregates in log space, so ``mean``
is the geometric mean, which then also becomes every token's weight).

All tensors are ``[B, S]``. Nothing here synchronises with the device.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..errors import number_in, one_of
from .kl import kl_estimate
from .masked import row_count

RS_LEVELS = ("token", "sequence")
RS_ACTIONS = ("mask", "clamp")
RS_METRICS = ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl")
RS_AGGS = ("sum", "mean", "max")

PROB_EPS = 1e-8
"""Probabilities are clamped to [eps, 1 - eps] in the binary KL so both logs stay finite."""


class RejectionResult(NamedTuple):
    """``mask``: bool ``[B, S]`` kept tokens (a subset of the input mask).
    ``weight``: float32 ``[B, S]`` behaviour importance weight, 0 outside ``mask``.
    ``n_rejected``: 0-dim count of input-mask tokens removed (mask action).
    ``n_clamped``: 0-dim count of kept tokens whose weight the clamp changed (clamp action).
    """

    mask: torch.Tensor
    weight: torch.Tensor
    n_rejected: torch.Tensor
    n_clamped: torch.Tensor


def bernoulli_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``KL(Bern(p) || Bern(q)) = p ln(p/q) + (1-p) ln((1-p)/(1-q))``, elementwise."""
    return p * (p.log() - q.log()) + (1 - p) * (torch.log1p(-p) - torch.log1p(-q))


def binary_kl(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """KPop metric: ``max`` of the two directed Bernoulli KLs between the token probabilities."""
    p = torch.exp(logp_a.float()).clamp(PROB_EPS, 1 - PROB_EPS)
    q = torch.exp(logp_b.float()).clamp(PROB_EPS, 1 - PROB_EPS)
    return torch.maximum(bernoulli_kl(p, q), bernoulli_kl(q, p))


def rejection_metric(prox_logp: torch.Tensor, behav_logp: torch.Tensor, *, metric: str) -> torch.Tensor:
    """Per-token divergence of pi_prox from pi_behav, float32 ``[B, S]``.

    The KL estimators see the raw logprobs, so an undefined value (NaN) fails every bound and the
    token is rejected rather than silently kept.
    """
    if metric == "ratio":
        return torch.exp(safe_log_ratio(prox_logp, behav_logp))
    if metric in ("kl_k1", "kl_k2", "kl_k3"):
        return kl_estimate(prox_logp, behav_logp, metric[-2:], clamp=False)
    if metric == "binary_kl":
        return binary_kl(prox_logp, behav_logp)
    raise ValueError(f"rejection metric must be one of {RS_METRICS}; got {metric!r}.")


def safe_log_ratio(prox_logp: torch.Tensor, behav_logp: torch.Tensor) -> torch.Tensor:
    """Detached float32 ``prox - behav`` with non-finite values (e.g. ``-inf - -inf``) set to 0."""
    lr = prox_logp.detach().float() - behav_logp.detach().float()
    return torch.where(torch.isfinite(lr), lr, 0.0)


def in_bounds(value: torch.Tensor, *, lower: float | None, upper: float) -> torch.Tensor:
    """Bool ``lower <= value <= upper`` (no lower bound when ``lower`` is None); NaN is out."""
    keep = value <= upper
    return keep if lower is None else keep & (value >= lower)


def _sequence_aggregate(value: torch.Tensor, mask: torch.Tensor, agg: str) -> torch.Tensor:
    """``[B]`` aggregate of ``value`` over each row's masked tokens; an empty row gives 0."""
    if agg == "sum":
        return torch.where(mask, value, 0.0).sum(-1)
    if agg == "mean":
        return torch.where(mask, value, 0.0).sum(-1) / row_count(mask).clamp_min(1)
    if agg == "max":
        top = torch.where(mask, value, float("-inf")).amax(-1)
        return torch.where(mask.any(-1), top, 0.0)
    raise ValueError(f"rejection agg must be one of {RS_AGGS}; got {agg!r}.")


def rejection_problems(key: str, *, level: str, action: str, metric: str, agg: str, upper: float,
                       lower: float | None) -> list[str]:
    """The rules of ``{key}`` (the ``rejection_sampling`` section); the enumerations are checked first."""
    p = [x for name, value, choices in (("level", level, RS_LEVELS), ("action", action, RS_ACTIONS),
                                        ("metric", metric, RS_METRICS), ("agg", agg, RS_AGGS))
         for x in one_of(f"{key}.{name}", value, choices)]
    if p:
        return p
    if lower is not None and lower > upper:
        p.append(f"{key}.lower: got {lower} > upper={upper}; lower must not exceed upper.")
    if metric == "ratio":
        p += number_in(f"{key}.upper", upper, 1.0, open_low=True, unit="for metric 'ratio'",
                       note="a ratio of 1 means on-policy; IcePop uses 5.0")
        p += number_in(f"{key}.lower", lower, 0, open_low=True, nullable=True, unit="for metric 'ratio'",
                       note="IcePop uses 0.5")
    if metric in ("kl_k2", "kl_k3", "binary_kl"):
        p += number_in(f"{key}.upper", upper, 0, open_low=True, unit=f"for metric '{metric}'")
    if action == "clamp" and metric != "ratio":
        p.append(f"{key}.action: action='clamp' only supports metric='ratio' (got metric={metric!r}); "
                 "use action=mask.")
    if metric == "binary_kl" and lower is not None:
        p.append(f"{key}.lower: got {lower}; metric 'binary_kl' (KPop) masks only above `upper`, "
                 f"remove `lower` ({key}.lower=null).")
    return p


def apply_rejection_sampling(
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    action: str = "mask",
    metric: str = "ratio",
    upper: float = 5.0,
    lower: float | None = None,
    agg: str = "mean",
) -> RejectionResult:
    """Filter (``mask``) or bound (``clamp``) tokens by their proximal/behaviour divergence.

    Args:
        prox_logp, behav_logp: ``[B, S]`` log pi_prox and log pi_behav of the taken tokens.
        mask: ``[B, S]`` bool tokens in the loss so far.
        level: ``token`` or ``sequence`` (one decision per row).
        action: ``mask`` removes out-of-bound units; ``clamp`` (ratio only) keeps them and clamps
            their weight to ``[lower or 0, upper]``.
        metric: ``ratio``, ``kl_k1``, ``kl_k2``, ``kl_k3`` or ``binary_kl``.
        upper, lower: inclusive bounds on the metric.
        agg: sequence-level aggregation over the row's masked tokens (ignored at token level).

    Returns:
        A :class:`RejectionResult`; the input ``mask`` is not modified.
    """
    if prox_logp.shape != behav_logp.shape or prox_logp.shape != mask.shape or prox_logp.dim() != 2:
        raise ValueError(f"prox, behav and mask must share one [B, S] shape; got {tuple(prox_logp.shape)}, "
                         f"{tuple(behav_logp.shape)}, {tuple(mask.shape)}.")
    mask = mask.bool()
    log_w = safe_log_ratio(prox_logp, behav_logp)
    weight = torch.exp(log_w)
    if level == "token":
        unit_metric = rejection_metric(prox_logp, behav_logp, metric=metric)
        keep = in_bounds(unit_metric, lower=lower, upper=upper)
    else:
        if metric == "ratio":
            # Log space: sum -> product of ratios, mean -> geometric mean, max -> largest ratio.
            seq_metric = torch.exp(_sequence_aggregate(log_w, mask, agg))
            # The weight becomes the row's geometric-mean ratio whatever `agg` decides with.
            weight = torch.exp(_sequence_aggregate(log_w, mask, "mean")).unsqueeze(-1).expand_as(weight)
        else:
            seq_metric = _sequence_aggregate(rejection_metric(prox_logp, behav_logp, metric=metric), mask, agg)
        keep = in_bounds(seq_metric, lower=lower, upper=upper).unsqueeze(-1).expand_as(mask)
    zero = mask.new_zeros((), dtype=torch.float32)
    if action == "mask":
        new_mask = mask & keep
        n_rejected = (mask & ~keep).sum(dtype=torch.float32)
        n_clamped = zero
    else:
        new_mask = mask
        # Token level clamps every token; sequence level only the tokens of out-of-bound rows.
        bounded = weight.clamp(0.0 if lower is None else lower, upper)
        clamped = bounded if level == "token" else torch.where(keep, weight, bounded)
        n_clamped = (mask & (clamped != weight)).sum(dtype=torch.float32)
        n_rejected = zero
        weight = clamped
    return RejectionResult(new_mask, torch.where(new_mask, weight, 0.0), n_rejected, n_clamped)
