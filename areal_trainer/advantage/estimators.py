"""Built-in estimator stages: ``token_gae`` and ``turn_gae`` (``fn(TemporalInputs) -> TemporalResult``).

Where the KL reward goes is the difference that matters beyond the time step:

* ``token_gae`` adds it to the reward stream, so it is discounted through the recursion and also
  reaches the critic returns;
* ``turn_gae`` keeps it out of the turn recursion and out of the returns, and adds each token's own
  KL reward to that token's actor advantage (summing a turn's KL and broadcasting it back would
  charge every token for its neighbours).
"""

from __future__ import annotations

import torch

from .datatypes import TemporalInputs, TemporalResult
from .gae import compute_gae_lambda, token_level_gae, turn_level_gae
from .turns import MISSING_TURN_IDS


def token_gae(inputs: TemporalInputs) -> TemporalResult:
    """GAE over active tokens; reward = outcome + KL + folded process rewards."""
    lam = compute_gae_lambda(inputs.loss_mask, inputs.turn_ids, time_unit="token", gae_lambda=inputs.gae_lambda,
                             kwargs=inputs.gae_lambda_kwargs)
    rewards = _plus(_plus(inputs.outcome_rewards, inputs, "kl_rewards"), inputs, "process_rewards")
    bootstrap = inputs.bootstrap_values * inputs.is_truncated
    adv, returns = token_level_gae(rewards, inputs.values, inputs.loss_mask, bootstrap,
                                   discount=inputs.discount, gae_lambda=lam)
    return TemporalResult(advantages=adv, returns=returns, total_rewards=rewards)


def turn_gae(inputs: TemporalInputs) -> TemporalResult:
    """GAE over non-empty turns on the task reward (outcome + folded process rewards); KL added after."""
    if inputs.turn_ids is None:
        raise ValueError(MISSING_TURN_IDS)
    lam = compute_gae_lambda(inputs.loss_mask, inputs.turn_ids, time_unit="turn", gae_lambda=inputs.gae_lambda,
                             kwargs=inputs.gae_lambda_kwargs)
    task = _plus(inputs.outcome_rewards, inputs, "process_rewards")
    bootstrap = inputs.bootstrap_values * inputs.is_truncated
    # The outcome alone sits at each row's last active token: the kernel takes it as one reward per row.
    rewards = task.sum(-1) if "process_rewards" in inputs.absent else task
    adv, returns = turn_level_gae(rewards, inputs.values, inputs.loss_mask, inputs.turn_ids, bootstrap,
                                  discount=inputs.discount, gae_lambda=lam)
    if "kl_rewards" not in inputs.absent:
        adv.add_(inputs.kl_rewards)  # adv is the kernel's new tensor
    return TemporalResult(advantages=adv, returns=returns, total_rewards=_plus(task, inputs, "kl_rewards"))


def _plus(x: torch.Tensor, inputs: TemporalInputs, name: str) -> torch.Tensor:
    """``x + inputs.<name>`` as a new tensor, or ``x`` itself when that input is absent (zeros)."""
    return x if name in inputs.absent else x + getattr(inputs, name)
