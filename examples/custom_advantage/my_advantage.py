"""Two user stages for ``actor.advantage`` (see README.md next to this file).

* ``scale_outcome``: an outcome stage that multiplies every row's reward by ``factor``.
* ``token_gae_kl_outside``: an estimator that runs token-level GAE on the task reward only and
  adds each token's KL reward to its advantage afterwards, so the KL penalty never reaches the
  critic returns (the turn estimator's rule, at token granularity). It resolves a dynamic
  ``actor.gae_lambda`` in its own unit, tokens.
"""

from __future__ import annotations

import torch

from areal_trainer.advantage import (
    OutcomeResult,
    OutcomeRewardInputs,
    TemporalInputs,
    TemporalResult,
    compute_gae_lambda,
)
from areal_trainer.advantage.gae import token_level_gae


def scale_outcome(inputs: OutcomeRewardInputs, *, factor: float) -> OutcomeResult:
    """``[B]`` rewards times ``factor`` (a new tensor; the input mapping is left alone)."""
    raw = inputs.data["rewards"].float()
    refs = None
    meta = inputs.meta
    if meta is not None and any(r is not None for r in meta.logical_rewards):
        # Explicit logical-rollout references must go through the same transform for reward_norm;
        # a rollout without one is represented by its first row.
        counts = torch.tensor(meta.logical_row_counts, device=raw.device)
        first = counts.cumsum(0) - counts
        given = torch.tensor([float("nan") if r is None else r for r in meta.logical_rewards], device=raw.device)
        refs = torch.where(given.isnan(), raw[first], given) * factor
    return OutcomeResult(rewards=raw * factor, normalization_rewards=refs)


def token_gae_kl_outside(inputs: TemporalInputs, *, kl_coef: float = 1.0) -> TemporalResult:
    """Token GAE on outcome + folded process rewards; ``kl_coef * kl_rewards`` added to the advantages only."""
    lam = compute_gae_lambda(inputs.loss_mask, inputs.turn_ids, time_unit="token",
                             gae_lambda=inputs.gae_lambda, kwargs=inputs.gae_lambda_kwargs)
    task = inputs.outcome_rewards + inputs.process_rewards
    bootstrap = inputs.bootstrap_values * inputs.is_truncated
    adv, returns = token_level_gae(task, inputs.values, inputs.loss_mask, bootstrap,
                                   discount=inputs.discount, gae_lambda=lam)
    kl = kl_coef * inputs.kl_rewards
    return TemporalResult(advantages=adv + kl, returns=returns, total_rewards=task + kl)
