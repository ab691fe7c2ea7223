"""Advantages, returns and rewards for the PPO-family update, with pluggable stages.

``compute_advantages(AdvantageInputs(data, config, meta))`` runs the computation the actor config
selects (``actor.advantage``): by default the length penalty, outcome shaping, reward
normalisation, GAE over tokens or turns, advantage normalisation and process shaping; any of the
three stages, or the whole computation, can be a user function given by import path.

Stage signatures (``kwargs`` come from the config)::

    outcome_reward_shaping: fn(OutcomeRewardInputs, **kwargs) -> OutcomeResult
    estimator:              fn(TemporalInputs, **kwargs) -> TemporalResult
    process_adv_shaping:    fn(ProcessAdvantageInputs, **kwargs) -> Tensor [B, S]
    group_baseline:         fn(GroupBaselineInputs, **kwargs) -> Tensor [B]   (in place of reward_norm)
    compute:                fn(AdvantageInputs, **kwargs) -> AdvantageResult

See :mod:`areal_trainer.advantage.datatypes` for the tensor conventions.
"""

from .datatypes import (
    EXTRAS_WHITELIST,
    AdvantageInputs,
    AdvantageResult,
    GroupBaselineInputs,
    OutcomeResult,
    OutcomeRewardInputs,
    ProcessAdvantageInputs,
    RolloutGroup,
    TemporalInputs,
    TemporalResult,
    TrajBatchMeta,
)
from .gae import GAELambdaContext, GAELambdaInputs, compute_gae_lambda
from .stages import compute_advantages, resolve_advantage

__all__ = [
    "EXTRAS_WHITELIST",
    "AdvantageInputs",
    "AdvantageResult",
    "GAELambdaContext",
    "GAELambdaInputs",
    "GroupBaselineInputs",
    "OutcomeResult",
    "OutcomeRewardInputs",
    "ProcessAdvantageInputs",
    "RolloutGroup",
    "TemporalInputs",
    "TemporalResult",
    "TrajBatchMeta",
    "compute_advantages",
    "compute_gae_lambda",
    "resolve_advantage",
]
