"""User functions referenced by import path in the stage tests (``tests.advantage.plugins_for_tests.*``)."""

from __future__ import annotations

import torch

from areal_trainer.advantage import (
    AdvantageResult,
    OutcomeResult,
    TemporalResult,
)

NOT_CALLABLE = 42
SEEN: dict[str, object] = {}
"""What the recording functions saw last."""


def scale_outcome(inputs, *, factor: float) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"] * factor)


def int_outcome(inputs) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"].long())


def wrong_shape_outcome(inputs) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"][None].float())


def nan_outcome(inputs) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"].float() * float("nan"))


def mutating_outcome(inputs) -> OutcomeResult:
    inputs.data["loss_mask"].mul_(1)
    return OutcomeResult(rewards=inputs.data["rewards"].float())


def tuple_outcome(inputs):
    return (inputs.data["rewards"].float(),)


def nan_estimator(inputs) -> TemporalResult:
    bad = torch.full_like(inputs.values, float("nan"))
    return TemporalResult(advantages=bad, returns=inputs.values, total_rewards=inputs.values)


def zero_process(inputs, *, value: float = 0.0) -> torch.Tensor:
    return torch.full_like(inputs.advantages, value)


def short_process(inputs) -> torch.Tensor:
    return inputs.advantages[:, :-1]


def recording_lambda(ctx, *, value: float = 1.0) -> torch.Tensor:
    SEEN["lambda_ctx"] = ctx
    return torch.full_like(ctx.timestep_lengths, value)


def _result(inputs, **override) -> AdvantageResult:
    ids = inputs.data["input_ids"]
    zeros = torch.zeros(ids.shape)
    fields = dict(advantages=torch.ones(ids.shape), returns=zeros, loss_mask=zeros, logprobs=zeros,
                  outcome_rewards=torch.zeros(ids.shape[0]), total_rewards=zeros, kl_rewards=zeros)
    fields.update(override)
    return AdvantageResult(**fields)


def constant_advantages(inputs, *, value: float = 1.0) -> AdvantageResult:
    ids = inputs.data["input_ids"]
    return _result(inputs, advantages=torch.full(ids.shape, value))


def non_binary_mask(inputs) -> AdvantageResult:
    return _result(inputs, loss_mask=torch.full(inputs.data["input_ids"].shape, 0.5))


def overwriting_extras(inputs) -> AdvantageResult:
    return _result(inputs, extras={"input_ids": inputs.data["input_ids"], "prox_logp": torch.zeros(1)})


def inf_returns(inputs) -> AdvantageResult:
    return _result(inputs, returns=torch.full(inputs.data["input_ids"].shape, float("inf")))


def mutating_replacement(inputs) -> AdvantageResult:
    inputs.data["rewards"].add_(1)
    return _result(inputs)


def record_baseline(inputs):
    """A group baseline that records what it sees and returns the scores unchanged."""
    SEEN["baseline"] = {"scores": inputs.scores.tolist(), "rewards": inputs.rewards.tolist(),
                        "sizes": inputs.group_sizes}
    return inputs.scores


def wrong_shape_baseline(inputs):
    """A group baseline that returns one value per group instead of per row."""
    return inputs.scores[:1]
