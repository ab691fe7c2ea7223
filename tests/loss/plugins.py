"""User loss functions referenced by import path in the tests (``tests.loss.plugins.*``)."""

from __future__ import annotations

import torch

from areal_trainer.loss import PolicyLoss, PolicyLossResult, SurrogateResult


def reinforce(x, *, scale: float = 1.0) -> SurrogateResult:
    """``-scale * A * r``: the plain importance-weighted policy gradient, no clip."""
    return SurrogateResult(-scale * x.advantages * x.ratio, {"actor/reinforce/scale": torch.tensor(scale)})


def wrong_shape(x) -> SurrogateResult:
    return SurrogateResult(x.ratio.sum(-1), {})


def nan_loss(x) -> SurrogateResult:
    return SurrogateResult(x.ratio * float("nan"), {})


def whole_loss(inputs, *, normalizer=None, weight: float = 1.0) -> PolicyLossResult:
    """The default loss, scaled: a whole-loss plugin that delegates."""
    res = PolicyLoss()(inputs, normalizer)
    return PolicyLossResult(weight * res.loss, {"actor/whole/weight": torch.tensor(weight)})


def vector_loss(inputs, *, normalizer=None) -> PolicyLossResult:
    return PolicyLossResult(inputs.logprobs.sum(-1), {})


def no_kwargs(x):
    return SurrogateResult(x.ratio, {})
