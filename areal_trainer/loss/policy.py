"""The actor's policy loss: composition of ratio, gate, filters and aggregation, bound once from config.

Objectives (one code path, switched by keyword arguments):

* PPO clipped surrogate (arXiv:1707.06347), optionally asymmetric (DAPO clip-higher,
  arXiv:2503.14476) and dual-clipped; GRPO (arXiv:2402.03300) and its variants differ only in the
  advantages and in the aggregation mode.
* GSPO (arXiv:2507.18071): sequence-level ratio and sequence-mean advantage.
* SAPO (arXiv:2511.20347): soft gates on the ratio against the behaviour policy; ignores pi_prox,
  clipping and rejection sampling.
* Decoupled PPO (AReaL, arXiv:2505.24298): ratio against pi_prox (given, or approximated from
  versions), and with rejection sampling configured, the behaviour weight pi_prox / pi_behav
  (masked or clamped; IcePop, KPop) multiplies the clipped loss. Without rejection sampling no
  behaviour weight is applied at all (AReaL's behaviour). With the decoupled loss off, rejection
  sampling is skipped entirely: it would compare the old policy with itself.
* M2PO (Zheng et al., 2025): drops the largest second-moment tokens of the micro-batch.

Order: resolve pi_prox -> M2PO mask -> rejection sampling -> ratio -> surrogate -> behaviour weight
-> aggregation. Denominators always count the loss mask *before* M2PO and rejection sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from .aggregate import LOSS_AGG_MODES, Normalizer, aggregate_loss, loss_normalizer
from .gate import clipped_surrogate, dual_clip, sapo_surrogate
from .m2po import m2po_mask, second_moment
from .masked import masked_max, masked_mean, masked_min
from .prox import PROX_LOGP_METHODS, approximate_prox_logp, prox_approx_metrics, version_alpha
from .ratio import IS_LEVELS, importance_ratio
from .rejection import RS_ACTIONS, RS_AGGS, RS_LEVELS, RS_METRICS, apply_rejection_sampling, safe_log_ratio
from .types import PolicyLossInputs, PolicyLossResult, Stats


@dataclass(frozen=True)
class RejectionSettings:
    """Rejection-sampling parameters (see :func:`~areal_trainer.loss.rejection.apply_rejection_sampling`)."""

    level: str = "token"
    action: str = "mask"
    metric: str = "ratio"
    upper: float = 5.0
    lower: float | None = None
    agg: str = "mean"

    def __post_init__(self) -> None:
        for name, choices in (("level", RS_LEVELS), ("action", RS_ACTIONS), ("metric", RS_METRICS), ("agg", RS_AGGS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"rejection_sampling.{name} must be one of {choices}; got {getattr(self, name)!r}.")
        if self.action == "clamp" and self.metric != "ratio":
            raise ValueError(f"action='clamp' only supports metric='ratio'; got metric={self.metric!r}.")


def resolve_prox_logp(
    inputs: PolicyLossInputs,
    theta_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    mask: torch.Tensor,
    n_valid: torch.Tensor,
    *,
    method: str,
    decoupled: bool,
) -> tuple[torch.Tensor, Stats]:
    """``[B, S]`` detached float32 log pi_prox, plus approximation stats.

    The given ``inputs.policies.proximal`` is used whenever present. When it is None the method must be
    ``loglinear`` and the versions must be given; pi_prox is then interpolated (see ``prox.py``).
    In ``metrics`` mode with the decoupled loss, the approximations are compared with the given one.
    """
    stats: Stats = {}
    pol = inputs.policies
    has_versions = pol.has_versions
    if pol.proximal is None:
        if method != "loglinear":
            raise ValueError(
                f"policies.proximal is None but prox_logp_method={method!r}: only 'loglinear' approximates "
                "pi_prox without a forward pass. Compute the proximal logprobs before the update "
                "(train/policies.py decides when), or pass the old logprobs when the decoupled loss is off.")
        if not has_versions:
            raise ValueError("prox_logp_method='loglinear' with policies.proximal=None needs `versions` [B, S] "
                             "and `current_version` to interpolate pi_prox.")
        alpha = version_alpha(pol.versions, pol.current_version)
        prox = approximate_prox_logp(behav_logp, theta_logp, alpha, method="loglinear")
        stats["actor/prox_approx/alpha"] = masked_mean(alpha, mask, n_valid)
        return prox, stats
    prox = pol.proximal.detach().float()
    if method == "metrics" and decoupled:
        if not has_versions:
            raise ValueError("prox_logp_method='metrics' compares the approximations with the recomputed "
                             "pi_prox and needs policies.versions [B, S] and policies.current_version.")
        alpha = version_alpha(pol.versions, pol.current_version)
        stats.update(prox_approx_metrics(prox, behav_logp, theta_logp, alpha, mask, n_valid))
    return prox, stats


def check_loss_settings(
    *,
    importance_sampling_level: str,
    eps_clip: float,
    eps_clip_higher: float | None,
    c_clip: float | None,
    m2_threshold: float | None,
    use_sapo_loss: bool,
    sapo_tau_pos: float,
    sapo_tau_neg: float,
    use_decoupled_loss: bool,
    rejection: RejectionSettings | None,
    prox_logp_method: str,
    loss_agg_mode: str,
    max_new_tokens: int | None,
) -> None:
    """Raise ``ValueError`` for settings the loss cannot run with (Python values only, no tensors)."""
    if importance_sampling_level not in IS_LEVELS:
        raise ValueError(f"Invalid importance_sampling_level {importance_sampling_level!r}; "
                         f"must be one of {IS_LEVELS}.")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}; got {loss_agg_mode!r}.")
    if prox_logp_method not in PROX_LOGP_METHODS:
        raise ValueError(f"prox_logp_method must be one of {PROX_LOGP_METHODS}; got {prox_logp_method!r}.")
    if eps_clip < 0 or (eps_clip_higher is not None and eps_clip_higher < 0):
        raise ValueError(f"eps_clip / eps_clip_higher must be >= 0; got {eps_clip}, {eps_clip_higher}.")
    if c_clip is not None and not c_clip > 1:
        raise ValueError(f"c_clip must be > 1 for dual clipping (or None); got {c_clip}.")
    if m2_threshold is not None and not m2_threshold > 0:
        raise ValueError(f"m2_threshold must be > 0 (or None); got {m2_threshold}.")
    if use_sapo_loss:
        if not (sapo_tau_pos > 0 and sapo_tau_neg > 0):
            raise ValueError(f"SAPO temperatures must be positive; got sapo_tau_pos={sapo_tau_pos}, "
                             f"sapo_tau_neg={sapo_tau_neg}.")
        if use_decoupled_loss:
            raise ValueError("SAPO is not compatible with use_decoupled_loss=True.")
    if loss_agg_mode == "seq-mean-token-sum-norm" and not (max_new_tokens or 0) > 0:
        raise ValueError(f"loss_agg_mode='seq-mean-token-sum-norm' needs max_new_tokens > 0; "
                         f"got {max_new_tokens!r}.")


def policy_loss(
    inputs: PolicyLossInputs,
    *,
    normalizer: Normalizer | None = None,
    importance_sampling_level: str = "token",
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    m2_threshold: float | None = None,
    use_sapo_loss: bool = False,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    use_decoupled_loss: bool = False,
    rejection: RejectionSettings | None = None,
    prox_logp_method: str = "recompute",
    loss_agg_mode: str = "token-mean",
    max_new_tokens: int | None = None,
) -> PolicyLossResult:
    """Policy loss of one micro-batch (all tensors ``[B, S]``, see :class:`PolicyLossInputs`).

    Args:
        normalizer: global unit count of the optimizer step (see ``aggregate.py``); None = local.
        importance_sampling_level: ``token`` or ``sequence`` (GSPO).
        eps_clip, eps_clip_higher: clip range ``[1 - eps_clip, 1 + (eps_clip_higher or eps_clip)]``.
        c_clip: dual-clip constant (> 1) or None.
        m2_threshold: M2PO tau or None.
        use_sapo_loss, sapo_tau_pos, sapo_tau_neg: SAPO soft gates instead of clipping.
        use_decoupled_loss: three-policy loss; enables ``rejection``.
        rejection: rejection-sampling settings, or None (no behaviour weight).
        prox_logp_method: ``recompute``, ``loglinear`` or ``metrics``.
        loss_agg_mode, max_new_tokens: aggregation (``max_new_tokens`` for ``seq-mean-token-sum-norm``).

    Returns:
        :class:`PolicyLossResult` with the 0-dim float32 loss and detached 0-dim stats.
    """
    check_loss_settings(importance_sampling_level=importance_sampling_level, eps_clip=eps_clip,
                        eps_clip_higher=eps_clip_higher, c_clip=c_clip, m2_threshold=m2_threshold,
                        use_sapo_loss=use_sapo_loss, sapo_tau_pos=sapo_tau_pos, sapo_tau_neg=sapo_tau_neg,
                        use_decoupled_loss=use_decoupled_loss, rejection=rejection,
                        prox_logp_method=prox_logp_method, loss_agg_mode=loss_agg_mode,
                        max_new_tokens=max_new_tokens)
    mask0 = inputs.loss_mask.bool()
    n_valid = mask0.sum(dtype=torch.float32)
    logp = inputs.logprobs.float()
    behav = inputs.policies.behavior.detach().float()
    adv = inputs.advantages.detach().float()
    prox, stats = resolve_prox_logp(inputs, logp, behav, mask0, n_valid, method=prox_logp_method,
                                    decoupled=use_decoupled_loss)

    mask = mask0
    if m2_threshold is not None:
        mask, n_m2 = m2po_mask(behav, prox, mask, threshold=m2_threshold)
        stats["actor/m2po/masked_frac"] = n_m2 / n_valid.clamp_min(1)
        stats["actor/m2po/m2"] = masked_mean(second_moment(behav, prox, mask0), mask0, n_valid)

    weight = None
    if use_decoupled_loss and rejection is not None and not use_sapo_loss:
        rs = apply_rejection_sampling(prox, behav, mask, level=rejection.level, action=rejection.action,
                                      metric=rejection.metric, upper=rejection.upper, lower=rejection.lower,
                                      agg=rejection.agg)
        mask, weight = rs.mask, rs.weight
        key = "masked_frac" if rejection.action == "mask" else "clamped_frac"
        count = rs.n_rejected if rejection.action == "mask" else rs.n_clamped
        stats[f"actor/rejection/{key}"] = count / n_valid.clamp_min(1)
        stats["actor/behave_weight"] = masked_mean(weight, mask0, n_valid)
        stats["actor/behave_weight/min"] = masked_min(weight, mask)
        stats["actor/behave_weight/max"] = masked_max(weight, mask)

    # SAPO's ratio is against the behaviour policy; PPO's against the proximal one.
    base = behav if use_sapo_loss else prox
    ratio, adv_used = importance_ratio(logp, base, adv, mask, level=importance_sampling_level)
    if use_sapo_loss:
        token_loss, gate, gate_pos, gate_neg = sapo_surrogate(ratio, adv_used, tau_pos=sapo_tau_pos,
                                                              tau_neg=sapo_tau_neg)
        stats["actor/sapo/gate"] = masked_mean(gate, mask, n_valid)
        stats["actor/sapo/gate_pos"] = masked_mean(gate_pos, mask, n_valid)
        stats["actor/sapo/gate_neg"] = masked_mean(gate_neg, mask, n_valid)
    else:
        eps_high = eps_clip if eps_clip_higher is None else eps_clip_higher
        token_loss, low, high = clipped_surrogate(ratio, adv_used, eps_low=eps_clip, eps_high=eps_high)
        stats["actor/clip_frac_low"] = masked_mean(low.float(), mask, n_valid)
        stats["actor/clip_frac_high"] = masked_mean(high.float(), mask, n_valid)
        stats["actor/clip_frac"] = masked_mean((low | high).float(), mask, n_valid)
        if c_clip is not None:
            token_loss, dual = dual_clip(token_loss, adv_used, c_clip=c_clip)
            stats["actor/dual_clip_frac"] = masked_mean(dual.float(), mask, n_valid)
        if weight is not None:
            token_loss = token_loss * weight
    token_loss = torch.where(mask, token_loss, 0.0)
    loss, norm_used = aggregate_loss(token_loss, mask0, mode=loss_agg_mode, normalizer=normalizer,
                                     max_new_tokens=max_new_tokens)

    stats.update(_common_stats(inputs, logp, base, prox, behav, adv, token_loss, mask0, n_valid,
                               level=importance_sampling_level, decoupled=use_decoupled_loss))
    stats["actor/loss/normalizer"] = loss_normalizer(mask0, loss_agg_mode)
    stats["actor/loss/normalizer_used/max"] = norm_used
    return PolicyLossResult(loss, {k: v.detach() for k, v in stats.items()})


def _common_stats(
    inputs: PolicyLossInputs,
    logp: torch.Tensor,
    base: torch.Tensor,
    prox: torch.Tensor,
    behav: torch.Tensor,
    adv: torch.Tensor,
    token_loss: torch.Tensor,
    mask0: torch.Tensor,
    n_valid: torch.Tensor,
    *,
    level: str,
    decoupled: bool,
) -> Stats:
    """Diagnostics over every loss token *before* filtering, so each is a mean over ``n_valid_tokens``."""
    with torch.no_grad():
        theta = logp.detach()
        ratio, _ = importance_ratio(theta, base, adv, mask0, level=level)
        stats = {
            "actor/n_valid_tokens": n_valid,
            "actor/token_loss": masked_mean(token_loss, mask0, n_valid),
            "actor/importance_ratio/mean": masked_mean(ratio, mask0, n_valid),
            "actor/importance_ratio/min": masked_min(ratio, mask0),
            "actor/importance_ratio/max": masked_max(ratio, mask0),
            "actor/approx_kl": masked_mean(theta - prox, mask0, n_valid),
            "actor/prox_nonfinite_frac": masked_mean((~torch.isfinite(prox)).float(), mask0, n_valid),
        }
        if decoupled:
            log_w = safe_log_ratio(prox, behav)
            stats["actor/behave_approx_kl"] = masked_mean(log_w, mask0, n_valid)
            stats["actor/behave_ratio/min"] = masked_min(torch.exp(log_w), mask0)
            stats["actor/behave_ratio/max"] = masked_max(torch.exp(log_w), mask0)
        if inputs.entropy is not None:
            stats["actor/entropy"] = masked_mean(inputs.entropy.detach().float(), mask0, n_valid)
        if inputs.policies.has_versions:
            v_b = inputs.policies.versions.float()
            generated = mask0 & (v_b >= 0)
            staleness = inputs.policies.current_version - v_b
            stats["actor/staleness"] = masked_mean(staleness, generated, n_valid)
            stats["actor/staleness/max"] = masked_max(staleness, generated)
    return stats


@dataclass(frozen=True)
class PolicyLossFn:
    """A policy loss with every knob fixed: ``fn(inputs, normalizer=None) -> PolicyLossResult``.

    Build it with :func:`bind_policy_loss`; the fields are the keyword arguments of :func:`policy_loss`
    and are validated once, here, so a bad setting fails before the first micro-batch.
    """

    importance_sampling_level: str = "token"
    eps_clip: float = 0.2
    eps_clip_higher: float | None = None
    c_clip: float | None = None
    m2_threshold: float | None = None
    use_sapo_loss: bool = False
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    use_decoupled_loss: bool = False
    rejection: RejectionSettings | None = None
    prox_logp_method: str = "recompute"
    loss_agg_mode: str = "token-mean"
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        check_loss_settings(**self.settings())

    def settings(self) -> dict[str, Any]:
        """The bound keyword arguments of :func:`policy_loss`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __call__(self, inputs: PolicyLossInputs, normalizer: Normalizer | None = None) -> PolicyLossResult:
        return policy_loss(inputs, normalizer=normalizer, **self.settings())


def bind_policy_loss(config: Any) -> PolicyLossFn:
    """Read the loss settings of an actor config (``PPOActorConfig``) once.

    Rejection sampling is bound only with the decoupled loss (and never for SAPO); ``action=clamp``
    without ``lower`` clamps from 0.
    """
    rs = config.rejection_sampling
    rejection = None
    if rs is not None and config.use_decoupled_loss and not config.use_sapo_loss:
        lower = rs.lower
        if rs.action == "clamp" and lower is None:
            lower = 0.0
        rejection = RejectionSettings(level=rs.level, action=rs.action, metric=rs.metric, upper=float(rs.upper),
                                      lower=None if lower is None else float(lower), agg=rs.agg)
    return PolicyLossFn(
        importance_sampling_level=config.importance_sampling_level,
        eps_clip=float(config.eps_clip),
        eps_clip_higher=None if config.eps_clip_higher is None else float(config.eps_clip_higher),
        c_clip=None if config.c_clip is None else float(config.c_clip),
        m2_threshold=None if config.m2_threshold is None else float(config.m2_threshold),
        use_sapo_loss=bool(config.use_sapo_loss),
        sapo_tau_pos=float(config.sapo_tau_pos),
        sapo_tau_neg=float(config.sapo_tau_neg),
        use_decoupled_loss=bool(config.use_decoupled_loss),
        rejection=rejection,
        prox_logp_method=config.prox_logp_method,
        loss_agg_mode=config.loss_agg_mode,
        max_new_tokens=int(config.max_new_tokens),
    )


def compute_policy_loss(
    inputs: PolicyLossInputs, config: Any, *, normalizer: Normalizer | None = None
) -> PolicyLossResult:
    """``bind_policy_loss(config)(inputs, normalizer)``; bind once and reuse the function in a loop."""
    return bind_policy_loss(config)(inputs, normalizer)
