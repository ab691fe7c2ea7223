"""Two user stages for ``actor.advantage`` (see README.md next to this file).

* ``length_penalty``: an outcome stage that subtracts ``coef * generated tokens / budget`` from every
  reward, so that of two equally correct answers the shorter one ranks higher. It changes the
  ranking inside a prompt's group, which is what survives GRPO's group standardisation (scaling a
  reward, or shifting it, does not: see README.md).
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


def length_penalty(inputs: OutcomeRewardInputs, *, coef: float = 0.1, budget: int | None = None) -> OutcomeResult:
    """``[B]`` rewards minus ``coef * tokens / budget`` (a new tensor; the input mapping is left alone).

    ``tokens`` counts the generated tokens of the row's logical rollout (every turn; the rows of one
    rollout share it); ``budget`` defaults to ``actor.max_new_tokens``. With 0/1 rewards and
    ``coef < 1`` a correct answer of at most ``budget`` tokens still outranks a wrong one.
    """
    raw = inputs.data["rewards"].float()
    tokens = inputs.data["loss_mask"].float().sum(-1)
    meta = inputs.meta
    counts = torch.tensor(meta.logical_row_counts if meta is not None else [1] * len(raw), device=raw.device)
    owner = torch.repeat_interleave(torch.arange(len(counts), device=raw.device), counts)
    per_rollout = torch.zeros(len(counts), device=raw.device).index_add_(0, owner, tokens)
    penalty = coef * per_rollout / (budget or inputs.config.max_new_tokens)
    refs = None
    if meta is not None and any(r is not None for r in meta.logical_rewards):
        # Explicit logical-rollout references must go through the same transform for reward_norm;
        # a rollout without one is represented by its first row.
        first = counts.cumsum(0) - counts
        given = torch.tensor([float("nan") if r is None else r for r in meta.logical_rewards], device=raw.device)
        refs = torch.where(given.isnan(), raw[first], given) - penalty
    return OutcomeResult(rewards=raw - penalty[owner], normalization_rewards=refs)


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
