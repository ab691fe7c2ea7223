"""On-policy distillation: the teacher's log-probs of the student's own sampled tokens turned into a
loss, alone or mixed with the RL loss. Three forms (``docs/distillation.md`` compares them):

* ``joint`` (AReaL's ``teacher``, KDRL): with RL weight ``w_rl > 0`` the loss is
  ``w_rl L_rl + w_d sum_m (log pi_theta - log pi_T) / N``; with ``w_rl = 0`` it is replaced by the
  reverse-KL policy gradient with importance sampling, ``-w_d sum_m [exp(log pi_theta - log pi_old)
  (log pi_T - sg(log pi_theta))] / N``.
* ``advantage`` (slime ``--opd-kl-coef``, tinker ``kl_penalty_coef``): ``A_t <- w_rl A_t - beta (log pi_old
  - log pi_T)`` at sampled tokens (``advantage/distill.py``), then the RL loss as it is.
* ``mopd`` (reference §6.10): ``l_t = -rho_t exp(lp - sg(lp)) s_t`` with the bounded stop-gradient IS weight
  ``rho = exp(min(sg(lp) - behav, log cap))`` against the immutable behaviour log-probs and the score
  ``s = sum_j w_j log pi_Tj - (sum_j w_j) sg(lp)``; the loss is ``rl L_rl + distill L_mopd`` (a zero
  coefficient drops its term).

Every input is ``[B, S]`` next-token aligned (``types.py``). Masked positions are replaced by 0 before
any ``exp``, so ``-inf`` there (a log-prob of a padded or prompt token) gives neither NaN in the value
nor in the gradient. The distillation terms are aggregated like the RL loss (``loss_agg_mode``, over
the step's global normaliser), so micro-batching does not change them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .aggregate import Normalizer, aggregate_loss, loss_normalizer
from .policy import entropy_staleness_stats
from .stats import declared, token_mean
from .types import PolicyLossInputs, PolicyLossResult, Stat, Stats

FORMS = ("joint", "advantage", "mopd")


def _clean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) with 0 wherever ``mask`` is false: masked ``-inf``/NaN never reach an ``exp``."""
    return torch.where(mask, x.float(), 0.0)


def kd_token_loss(logp: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """AReaL's KD term next to RL: ``[B, S]`` ``log pi_theta - log pi_T`` on ``mask``, 0 elsewhere.

    Its gradient is ``grad log pi_theta`` at every sampled token, whose expectation under on-policy
    samples is 0 (the score-function identity): it moves the policy only through sampling noise and
    off-policy samples (docs/distillation.md)."""
    m = mask.bool()
    return torch.where(m, _clean(logp, m) - _clean(teacher, m), 0.0)


def reverse_kl_pg_token_loss(logp: torch.Tensor, old: torch.Tensor, teacher: torch.Tensor,
                             mask: torch.Tensor) -> torch.Tensor:
    """AReaL's pure distillation (``rl_loss_weight=0``): ``[B, S]`` ``-exp(lp - old) (log pi_T - sg(lp))`` on
    ``mask``: the policy gradient of the reverse KL ``KL(pi_theta || pi_T)`` with the per-token reward
    ``log pi_T - log pi_theta``, importance-weighted against ``old`` (the loss's behaviour policy)."""
    m = mask.bool()
    lp = _clean(logp, m)
    ratio = torch.exp(lp - _clean(old, m))
    return torch.where(m, -ratio * (_clean(teacher, m) - lp.detach()), 0.0)


def mopd_token_loss(logp: torch.Tensor, behavior: torch.Tensor, teacher_sum: torch.Tensor,
                    weight_sum: torch.Tensor, mask: torch.Tensor, *, ratio_cap: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MOPD's per-token loss (reference §6.10), ``[B, S]`` each: ``(loss, rho, clipped)``.

    ``rho = exp(min(sg(lp) - behavior, log ratio_cap))``, ``s = sg(teacher_sum) - sg(weight_sum) sg(lp)``,
    ``loss = -rho exp(lp - sg(lp)) s`` (the carrier ``exp(lp - sg(lp))`` is 1 in value and passes the
    gradient of ``lp``); ``clipped`` marks tokens whose IS weight hit the cap. All 0 off ``mask``.
    """
    m = mask.bool()
    lp = _clean(logp, m)
    sg = lp.detach()
    log_rho = sg - _clean(behavior, m).detach()
    log_cap = math.log(ratio_cap)
    clipped = m & (log_rho > log_cap)
    rho = torch.exp(log_rho.clamp_max(log_cap))
    score = _clean(teacher_sum, m).detach() - _clean(weight_sum, m).detach() * sg
    carrier = torch.exp(lp - sg)
    return torch.where(m, -rho * carrier * score, 0.0), torch.where(m, rho, 0.0), clipped


def distill_stats(logp: torch.Tensor, teacher_sum: torch.Tensor, weight_sum: torch.Tensor,
                  mask: torch.Tensor) -> Stats:
    """``distill/*`` means over the trained tokens ``mask`` (``[B, S]`` each): ``reverse_kl`` (``log pi_theta
    - log pi_T``, the sampled-token estimate of KL(pi_theta || pi_T); with several teachers pi_T is their
    weighted mean in log space) and ``teacher_logp``; plus ``n_valid_tokens``."""
    m = mask.bool()
    n = m.sum(dtype=torch.float32)
    with torch.no_grad():
        t = _clean(teacher_sum, m) / _clean(weight_sum, m).clamp_min(1e-30)
        return {"distill/n_valid_tokens": Stat.sum(n),
                "distill/reverse_kl": token_mean(_clean(logp, m) - t, m, n),
                "distill/teacher_logp": token_mean(t, m, n)}


@dataclass(frozen=True)
class DistillLoss:
    """The policy loss with a teacher: ``loss(inputs, normalizer=None) -> PolicyLossResult`` for one
    micro-batch, like the RL loss ``rl`` it wraps. ``inputs.policies.teacher`` must be set.

    Attributes:
        rl: the bound RL loss (the staged ``PolicyLoss`` or a user's whole loss).
        form: ``joint``, ``advantage`` or ``mopd`` (module docstring).
        rl_weight, distill_weight: the two weights (``rl_loss_weight`` / ``distill_loss_weight``, or MOPD's
            ``rl_coefficient`` / ``distillation_coefficient``). With ``advantage`` both act in the
            advantages and the RL loss is used as it is.
        ratio_cap: MOPD's IS-weight cap.
        loss_agg_mode, max_new_tokens: the aggregation of the distillation term (the RL loss's).
    """

    rl: Callable[..., PolicyLossResult]
    form: str = "joint"
    rl_weight: float = 1.0
    distill_weight: float = 0.005
    ratio_cap: float = 5.0
    loss_agg_mode: str = "token-mean"
    max_new_tokens: int | None = None

    def __call__(self, inputs: PolicyLossInputs, normalizer: Normalizer | None = None) -> PolicyLossResult:
        t = inputs.policies.teacher
        if t is None:
            raise ValueError("DistillLoss needs inputs.policies.teacher (the teachers' log-probs of the batch).")
        mask0 = inputs.loss_mask.bool()
        logp = inputs.logprobs
        loss, stats = None, {}
        if self.form == "advantage" or self.rl_weight > 0:
            rl = self.rl(inputs, normalizer=normalizer)
            loss = rl.loss if self.form == "advantage" else self.rl_weight * rl.loss
            stats = dict(rl.stats)
        else:  # pure distillation: no RL loss at all, only the statistics every step reports
            stats = _actor_stats(inputs, mask0, self.loss_agg_mode)
        token = None
        if self.form == "joint":
            token = (kd_token_loss(logp, t.logp, mask0) if self.rl_weight > 0 else
                     reverse_kl_pg_token_loss(logp, inputs.policies.behavior, t.logp, mask0))
        elif self.form == "mopd":
            if t.behavior is None:
                raise ValueError("the MOPD loss needs policies.teacher.behavior (extras['mopd_behavior_logprobs']).")
            token, rho, clipped = mopd_token_loss(logp, t.behavior, t.logp, t.weight, mask0, ratio_cap=self.ratio_cap)
            n = mask0.sum(dtype=torch.float32)
            stats["distill/is_weight"] = token_mean(rho, mask0, n)
            stats["distill/is_clip_frac"] = Stat.mean(clipped.sum(dtype=torch.float32) / n.clamp_min(1), weight=n)
        if token is not None and self.distill_weight > 0:
            term, _ = aggregate_loss(token, mask0, mode=self.loss_agg_mode, normalizer=normalizer,
                                     max_new_tokens=self.max_new_tokens)
            loss = self.distill_weight * term if loss is None else loss + self.distill_weight * term
            stats["distill/token_loss"] = token_mean(token.detach(), mask0)
        stats.update(distill_stats(logp.detach(), t.logp, t.weight, mask0))
        return PolicyLossResult(loss, declared(stats))  # a user's whole RL loss may give plain tensors


def _actor_stats(inputs: PolicyLossInputs, mask0: torch.Tensor, mode: str) -> Stats:
    """What pure distillation reports under ``actor/`` (it runs no RL loss): the token count, the
    normaliser, the ratio to the behaviour policy, the entropy and the staleness."""
    n = mask0.sum(dtype=torch.float32)
    with torch.no_grad():
        ratio = torch.exp(_clean(inputs.logprobs, mask0) - _clean(inputs.policies.behavior, mask0))
        stats = {"actor/n_valid_tokens": Stat.sum(n), "actor/loss/normalizer": Stat.sum(loss_normalizer(mask0, mode)),
                 "actor/importance_ratio/mean": token_mean(ratio, mask0, n)}
    return {**stats, **entropy_staleness_stats(inputs, mask0, n)}  # as the RL loss reports them
