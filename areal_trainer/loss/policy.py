"""The actor's policy loss: registered stages composed in one fixed order, bound once from config
(``config/loss.py``): the ratio (``ratio.py``, by ``importance_sampling_level``), the token filters
and behaviour weight (``m2po.py``, ``rejection.py``), the surrogate (``surrogate.py``) and the
aggregation (``aggregate.py``).

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
Settings arrive checked (``config/`` checks every rule at start-up); this module checks shapes only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .aggregate import Normalizer, aggregate_loss, loss_normalizer
from .m2po import m2po_mask, second_moment
from .masked import masked_max, masked_min
from .prox import approximate_prox_logp, prox_approx_metrics, version_alpha
from .ratio import importance_ratio
from .rejection import apply_rejection_sampling, safe_log_ratio
from .stats import declared, token_mean
from .surrogate import SURROGATES, Surrogate, SurrogateInputs
from .types import PolicyLossInputs, PolicyLossResult, Stat, Stats


@dataclass(frozen=True)
class RejectionSettings:
    """Rejection-sampling parameters (see :func:`~areal_trainer.loss.rejection.apply_rejection_sampling`)."""

    level: str = "token"
    action: str = "mask"
    metric: str = "ratio"
    upper: float = 5.0
    lower: float | None = None
    agg: str = "mean"


@dataclass(frozen=True)
class BoundSurrogate:
    """A surrogate (``spec``) with its settings, under ``name`` (a built-in name or an import path)."""

    name: str = "clip"
    spec: Surrogate = SURROGATES["clip"]
    settings: Mapping[str, Any] = field(default_factory=lambda: {"eps_clip": 0.2})

    def __call__(self, x: SurrogateInputs):
        return self.spec.fn(x, **self.settings)


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
        stats["actor/prox_approx/alpha"] = token_mean(alpha, mask, n_valid)
        return prox, stats
    prox = pol.proximal.detach().float()
    if method == "metrics" and decoupled:
        if not has_versions:
            raise ValueError("prox_logp_method='metrics' compares the approximations with the recomputed "
                             "pi_prox and needs policies.versions [B, S] and policies.current_version.")
        alpha = version_alpha(pol.versions, pol.current_version)
        stats.update(prox_approx_metrics(prox, behav_logp, theta_logp, alpha, mask, n_valid))
    return prox, stats


@dataclass(frozen=True)
class PolicyLoss:
    """The bound policy loss: ``loss(inputs, normalizer=None) -> PolicyLossResult`` for one micro-batch.

    Attributes:
        surrogate: the surrogate with its settings.
        importance_sampling_level: ``token`` or ``sequence`` (GSPO), a key of ``ratio.RATIOS``.
        use_decoupled_loss: three-policy loss; enables ``rejection`` (for surrogates that take the
            behaviour weight).
        rejection: rejection-sampling settings, or None (no behaviour weight).
        m2_threshold: M2PO tau or None.
        prox_logp_method: ``recompute``, ``loglinear`` or ``metrics``.
        loss_agg_mode, max_new_tokens: aggregation (``max_new_tokens`` for ``seq-mean-token-sum-norm``).
    """

    surrogate: BoundSurrogate = field(default_factory=BoundSurrogate)
    importance_sampling_level: str = "token"
    use_decoupled_loss: bool = False
    rejection: RejectionSettings | None = None
    m2_threshold: float | None = None
    prox_logp_method: str = "recompute"
    loss_agg_mode: str = "token-mean"
    max_new_tokens: int | None = None

    def __call__(self, inputs: PolicyLossInputs, normalizer: Normalizer | None = None) -> PolicyLossResult:
        """Policy loss of one micro-batch (all tensors ``[B, S]``, see :class:`PolicyLossInputs`).

        ``normalizer``: the global unit count of the optimizer step (see ``aggregate.py``); None = local.
        Returns the 0-dim float32 loss and detached 0-dim stats.
        """
        spec = self.surrogate.spec
        mask0 = inputs.loss_mask.bool()
        n_valid = mask0.sum(dtype=torch.float32)
        logp = inputs.logprobs.float()
        behav = inputs.policies.behavior.detach().float()
        adv = inputs.advantages.detach().float()
        prox, stats = resolve_prox_logp(inputs, logp, behav, mask0, n_valid, method=self.prox_logp_method,
                                        decoupled=self.use_decoupled_loss)

        mask = mask0
        if self.m2_threshold is not None:
            mask, n_m2 = m2po_mask(behav, prox, mask, threshold=self.m2_threshold)
            stats["actor/m2po/masked_frac"] = Stat.mean(n_m2 / n_valid.clamp_min(1), weight=n_valid)
            stats["actor/m2po/m2"] = token_mean(second_moment(behav, prox, mask0), mask0, n_valid)

        weight = None
        rs = self.rejection
        if self.use_decoupled_loss and rs is not None and spec.behavior_weight:
            out = apply_rejection_sampling(prox, behav, mask, level=rs.level, action=rs.action, metric=rs.metric,
                                           upper=rs.upper, lower=rs.lower, agg=rs.agg)
            mask, weight = out.mask, out.weight
            key = "masked_frac" if rs.action == "mask" else "clamped_frac"
            count = out.n_rejected if rs.action == "mask" else out.n_clamped
            stats[f"actor/rejection/{key}"] = Stat.mean(count / n_valid.clamp_min(1), weight=n_valid)
            stats["actor/behave_weight"] = token_mean(weight, mask0, n_valid)
            stats["actor/behave_weight/min"] = Stat.min(masked_min(weight, mask))
            stats["actor/behave_weight/max"] = Stat.max(masked_max(weight, mask))

        base = prox if spec.base == "proximal" else behav
        ratio, adv_used = importance_ratio(logp, base, adv, mask, level=self.importance_sampling_level)
        token_loss, surrogate_stats = self.surrogate(SurrogateInputs(ratio, adv_used, logp, mask, n_valid))
        stats.update(surrogate_stats)  # a user's plain tensors get their default in declared() below
        if weight is not None:
            token_loss = token_loss * weight
        token_loss = torch.where(mask, token_loss, 0.0)
        loss, norm_used = aggregate_loss(token_loss, mask0, mode=self.loss_agg_mode, normalizer=normalizer,
                                         max_new_tokens=self.max_new_tokens)

        stats.update(_common_stats(inputs, logp, base, prox, behav, adv, token_loss, mask0, n_valid,
                                   level=self.importance_sampling_level, decoupled=self.use_decoupled_loss))
        stats["actor/loss/normalizer"] = Stat.sum(loss_normalizer(mask0, self.loss_agg_mode))
        stats["actor/loss/normalizer_used/max"] = Stat.max(norm_used)
        return PolicyLossResult(loss, declared(stats))


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
            "actor/n_valid_tokens": Stat.sum(n_valid),
            "actor/token_loss": token_mean(token_loss, mask0, n_valid),
            "actor/importance_ratio/mean": token_mean(ratio, mask0, n_valid),
            "actor/importance_ratio/min": Stat.min(masked_min(ratio, mask0)),
            "actor/importance_ratio/max": Stat.max(masked_max(ratio, mask0)),
            "actor/approx_kl": token_mean(theta - prox, mask0, n_valid),
            "actor/prox_nonfinite_frac": token_mean((~torch.isfinite(prox)).float(), mask0, n_valid),
        }
        if decoupled:
            log_w = safe_log_ratio(prox, behav)
            stats["actor/behave_approx_kl"] = token_mean(log_w, mask0, n_valid)
            stats["actor/behave_ratio/min"] = Stat.min(masked_min(torch.exp(log_w), mask0))
            stats["actor/behave_ratio/max"] = Stat.max(masked_max(torch.exp(log_w), mask0))
        stats.update(entropy_staleness_stats(inputs, mask0, n_valid))
    return stats


def entropy_staleness_stats(inputs: PolicyLossInputs, mask0: torch.Tensor, n_valid: torch.Tensor) -> Stats:
    """``actor/entropy`` (with ``inputs.entropy``) and, with versions, ``actor/staleness`` (mean over the
    ``n_valid`` trained tokens) and ``actor/staleness/max`` of the generated tokens of ``mask0``."""
    stats: Stats = {}
    with torch.no_grad():
        if inputs.entropy is not None:
            stats["actor/entropy"] = token_mean(inputs.entropy.detach().float(), mask0, n_valid)
        if inputs.policies.has_versions:
            v_b = inputs.policies.versions.float()
            generated = mask0 & (v_b >= 0)
            staleness = inputs.policies.current_version - v_b
            stats["actor/staleness"] = token_mean(staleness, generated, n_valid)
            stats["actor/staleness/max"] = Stat.max(masked_max(staleness, generated))
    return stats
