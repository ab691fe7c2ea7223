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

import importlib

_HOME = {
    **dict.fromkeys(("EXTRAS_WHITELIST", "AdvantageInputs", "AdvantageResult", "GroupBaselineInputs", "OutcomeResult",
                     "OutcomeRewardInputs", "ProcessAdvantageInputs", "RolloutGroup", "TemporalInputs",
                     "TemporalResult", "TrajBatchMeta"), "datatypes"),
    **dict.fromkeys(("GAELambdaContext", "GAELambdaInputs", "compute_gae_lambda"), "gae"),
    "AdvantageSettings": "settings",
    "AdvantageFn": "stages",
}
"""Where each public name lives. They are imported on first use, so that the schema can import the
torch-free ``settings`` module (its ``Norm``) without importing torch."""

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
