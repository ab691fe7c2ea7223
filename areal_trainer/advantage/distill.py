"""The advantage side of on-policy distillation (the loss side is ``loss/distill.py``):

* :func:`mopd_behavior_logprobs`: MOPD's immutable behaviour log-probs, the rollout's own log-probs
  rolled into next-token alignment and masked, stored by the default pipeline (and by a full
  replacement, which owns alignment) in ``AdvantageResult.extras["mopd_behavior_logprobs"]``. MOPD's
  IS weight is always taken against them, even when ``recompute_logprob`` overwrites pi_old.
* :func:`distillation_only`: pure distillation (RL weight 0) computes no reward and no GAE, as in
  AReaL: only the aligned mask and pi_old, zero advantages and returns, and the behaviour log-probs.
* :func:`add_distill_advantage`: the ``advantage`` form (slime, tinker),
  ``A_t <- w_rl A_t - beta (log pi_old - log pi_T)`` at trained tokens.
"""

from __future__ import annotations

import dataclasses

import torch

from .align import aligned_mask, masked_shift_left, old_logprobs, truncation_flags
from .datatypes import AdvantageInputs, AdvantageResult


def mopd_behavior_logprobs(data, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` float32: the rollout's ``logprobs`` (token-aligned) rolled left by one, times the aligned
    ``mask``, detached (a new tensor: later stages cannot change it)."""
    return masked_shift_left(data["logprobs"], mask)


def distillation_only(inputs: AdvantageInputs) -> AdvantageResult:
    """Pure distillation: no reward, no advantage estimation. The result has the aligned loss mask, the
    masked pi_old, zeros for advantages, returns and rewards, and in ``extras`` the truncation flags, the
    rollout mask and, with ``inputs.mopd``, the behaviour log-probs."""
    data = inputs.data
    n_rows, width = data["input_ids"].shape
    m = aligned_mask(data["loss_mask"])
    zeros = torch.zeros((n_rows, width), device=m.device)
    extras = {"is_truncated": truncation_flags(data, data["attention_mask"].sum(-1), width),
              "input_token_loss_mask": data["loss_mask"]}
    if inputs.mopd:
        extras["mopd_behavior_logprobs"] = mopd_behavior_logprobs(data, m)
    return AdvantageResult(advantages=zeros, returns=zeros, loss_mask=m,
                           logprobs=old_logprobs(inputs.old_logprobs, data, m),
                           outcome_rewards=torch.zeros(n_rows, device=m.device), total_rewards=zeros,
                           kl_rewards=zeros, extras=extras)


def distill_advantage(advantages: torch.Tensor, old: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, *,
                      rl_weight: float, coef: float) -> torch.Tensor:
    """``[B, S]`` ``rl_weight * advantages - coef * (old - teacher)`` on ``mask``, 0 elsewhere (all ``[B, S]``;
    ``old`` is log pi_old of the sampled tokens, ``teacher`` log pi_T). Masked positions are cleared
    first, so a ``-inf`` there does not turn into NaN."""
    m = mask.bool()
    gap = torch.where(m, old.float(), 0.0) - torch.where(m, teacher.float(), 0.0)
    return torch.where(m, rl_weight * advantages.float() - coef * gap, 0.0)


def add_distill_advantage(result: AdvantageResult, teacher: torch.Tensor, *, rl_weight: float,
                          coef: float) -> AdvantageResult:
    """``result`` with its advantages replaced by :func:`distill_advantage` (returns untouched: the critic
    still fits the task's returns)."""
    adv = distill_advantage(result.advantages, result.logprobs, teacher, result.loss_mask, rl_weight=rl_weight,
                            coef=coef)
    return dataclasses.replace(result, advantages=adv)
