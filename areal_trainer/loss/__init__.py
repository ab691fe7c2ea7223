"""Policy and value losses of the PPO family.

One clipped-surrogate code path covers PPO (arXiv:1707.06347), GRPO (arXiv:2402.03300),
Dr.GRPO (arXiv:2503.20783), DAPO's clip-higher and token-mean loss (arXiv:2503.14476), GSPO's
sequence-level ratio (arXiv:2507.18071), SAPO's soft gates (arXiv:2511.20347), dual clipping,
decoupled PPO with a proximal policy (AReaL, arXiv:2505.24298) and its rejection-sampling filters
(IcePop ratio band, KPop binary-KL mask), and the M2PO second-moment filter (Zheng et al., 2025).
The trainer owns the forward pass; these functions only see per-token tensors.

Usage::

    loss_fn = bind_policy_loss(actor_config)              # once (areal_trainer.components.loss)
    n = sum(loss_normalizer(mb.loss_mask, actor_config.loss_agg_mode) for mb in micro_batches)
    for mb in micro_batches:                               # all-reduce n over ranks first
        loss, stats = loss_fn(PolicyLossInputs(...), normalizer=n)
        loss.backward()                                    # the summed losses are the step objective

Tensors are ``[B, S]`` right-padded rows, next-token aligned (see :mod:`.types`).

Stats convention. Every stats dict maps slash-namespaced names (``actor/...``, ``critic/...``) to
:class:`Stat` values: a detached 0-dim tensor (no ``.item()``: nothing in the loss path synchronises
with the device) made with how it combines over the micro-batches of a step, where it is computed
(:func:`reduce_stats` combines them; the trainer carries the same reduction across processes):

* ``Stat.min`` / ``Stat.max``: the ``.../min`` and ``.../max`` extremes (an empty micro-batch reports
  +inf / -inf, the identities);
* ``Stat.sum``: the counts ``n_valid_tokens`` (``actor/n_valid_tokens``: loss tokens before any
  filter) and ``loss/normalizer`` (the local aggregation count of :func:`loss_normalizer`);
* ``Stat.mean(x, weight=n_valid_tokens)`` (:func:`token_mean`): every other key, a mean over the
  micro-batch's valid tokens, so the step value is the mean weighted by its tokens. Fractions
  (``clip_frac``, ``rejection/masked_frac``, ...) are counts divided by that same pre-filter token count.

A user's surrogate or whole loss may return plain 0-dim tensors; they get a default (:func:`declared`).

Actor keys: ``n_valid_tokens``, ``loss/normalizer``, ``loss/normalizer_used/max`` (the divisor
actually applied; the global one when the trainer passes it), ``token_loss``,
``importance_ratio/{mean,min,max}``, ``approx_kl`` (log pi_theta - log pi_prox),
``prox_nonfinite_frac``, and as configured: ``clip_frac``, ``clip_frac_low``, ``clip_frac_high``,
``dual_clip_frac``; ``sapo/gate``, ``sapo/gate_pos``, ``sapo/gate_neg``; ``m2po/masked_frac``,
``m2po/m2``; ``behave_approx_kl``, ``behave_ratio/{min,max}`` (decoupled);
``rejection/masked_frac`` or ``rejection/clamped_frac``, ``behave_weight``,
``behave_weight/{min,max}``; ``entropy``; ``staleness``, ``staleness/max`` (with versions);
``prox_approx/alpha`` and ``prox_approx/<method>/{abs_err,rel_err,sq_err,weight_abs_err}``.
Critic keys: see :func:`value_loss`. With a teacher (:class:`DistillLoss`): ``distill/n_valid_tokens``,
``distill/reverse_kl``, ``distill/teacher_logp``, ``distill/token_loss``, and with MOPD ``distill/is_weight``,
``distill/is_clip_frac``.
"""

from .aggregate import AGGREGATIONS, LOSS_AGG_MODES, aggregate_loss, loss_normalizer
from .distill import DistillLoss
from .m2po import m2po_mask
from .policy import BoundSurrogate, PolicyLoss, RejectionSettings, resolve_prox_logp
from .prox import approximate_prox_logp, version_alpha
from .ratio import RATIOS, importance_ratio, sequence_mean_advantage, sequence_ratio, token_ratio
from .rejection import RejectionResult, apply_rejection_sampling, binary_kl
from .stats import declared, reduce_stats, token_mean
from .surrogate import (
    SURROGATES,
    Surrogate,
    SurrogateInputs,
    SurrogateResult,
    clip_ratio,
    clipped_surrogate,
    dual_clip,
    sapo_gate,
    sapo_surrogate,
)
from .types import (
    PolicyLogprobs,
    PolicyLossInputs,
    PolicyLossResult,
    PolicyPlan,
    Reduction,
    Stat,
    Stats,
    TeacherLogprobs,
)
from .value import explained_variance, value_loss

__all__ = [
    "AGGREGATIONS",
    "LOSS_AGG_MODES",
    "RATIOS",
    "SURROGATES",
    "BoundSurrogate",
    "DistillLoss",
    "PolicyLogprobs",
    "PolicyLoss",
    "PolicyLossInputs",
    "PolicyLossResult",
    "PolicyPlan",
    "Reduction",
    "RejectionResult",
    "RejectionSettings",
    "Stat",
    "Stats",
    "Surrogate",
    "SurrogateInputs",
    "SurrogateResult",
    "TeacherLogprobs",
    "aggregate_loss",
    "apply_rejection_sampling",
    "approximate_prox_logp",
    "binary_kl",
    "clip_ratio",
    "clipped_surrogate",
    "declared",
    "dual_clip",
    "explained_variance",
    "importance_ratio",
    "loss_normalizer",
    "m2po_mask",
    "reduce_stats",
    "resolve_prox_logp",
    "sapo_gate",
    "sapo_surrogate",
    "sequence_mean_advantage",
    "sequence_ratio",
    "token_mean",
    "token_ratio",
    "value_loss",
    "version_alpha",
]
