"""Builders shared by the loss tests."""

from __future__ import annotations

import warnings

import torch

from areal_trainer.config import PPOActorConfig, RejectionSamplingConfig
from areal_trainer.loss import PolicyLogprobs, PolicyLossInputs


def t(rows, dtype=torch.float32) -> torch.Tensor:
    """A ``[B, S]`` tensor from nested lists."""
    return torch.tensor(rows, dtype=dtype)


def mask_of(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def actor_config(**kwargs) -> PPOActorConfig:
    """A validated actor config; the advisory warnings (e.g. decoupled without RS) are silenced."""
    rs = kwargs.pop("rejection_sampling", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if isinstance(rs, dict):
            rs = RejectionSamplingConfig(**rs)
        return PPOActorConfig(rejection_sampling=rs, **kwargs)


def loss_inputs(logp, prox, behav, adv, mask, *, versions=None, current_version=None, entropy=None
                ) -> PolicyLossInputs:
    """``PolicyLossInputs`` from the five tensors (``prox`` None: approximate it) and the optional extras."""
    return PolicyLossInputs(logp, PolicyLogprobs(behav, prox, versions, current_version), adv, mask, entropy)


def inputs(logp, adv, mask, prox=None, behav=None, *, requires_grad=True, **extra) -> PolicyLossInputs:
    """Inputs with ``prox = behav = logp`` (ratio 1) unless given; ``logp`` becomes a leaf with grad."""
    logp = torch.as_tensor(logp, dtype=torch.float32).clone().requires_grad_(requires_grad)
    prox = logp.detach().clone() if prox is None else torch.as_tensor(prox, dtype=torch.float32)
    behav = prox.clone() if behav is None else torch.as_tensor(behav, dtype=torch.float32)
    return loss_inputs(logp, prox, behav, torch.as_tensor(adv, dtype=torch.float32), torch.as_tensor(mask).bool(),
                       **extra)
