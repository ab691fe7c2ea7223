"""Advantages, returns and rewards for the PPO-family update, with pluggable stages.

The computation ``actor.advantage`` selects is bound once at start-up
(``areal_trainer.components.advantage.bind_advantage``) into an :class:`AdvantageFn`, called as
``fn(AdvantageInputs(data, config, meta))``: by default the length penalty, outcome shaping, reward
normalisation, GAE over tokens or turns, advantage normalisation and process shaping, reading one frozen
:class:`AdvantageSettings`; any of the stages, or the whole computation, can be a user function given
by import path. This package imports nothing of the trainer but the loss's KL estimators.

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
from .settings import AdvantageSettings, Norm
from .stages import AdvantageFn

__all__ = [
    "EXTRAS_WHITELIST",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageSettings",
    "AdvantageResult",
    "GAELambdaContext",
    "GAELambdaInputs",
    "GroupBaselineInputs",
    "Norm",
    "OutcomeResult",
    "OutcomeRewardInputs",
    "ProcessAdvantageInputs",
    "RolloutGroup",
    "TemporalInputs",
    "TemporalResult",
    "TrajBatchMeta",
    "compute_gae_lambda",
]
