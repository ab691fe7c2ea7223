"""Builders shared by the loss tests."""

from __future__ import annotations

import dataclasses
import warnings

import torch

from areal_trainer.components import problems_and_build
from areal_trainer.components.loss import bind_policy_loss
from areal_trainer.config import (
    ConfigError,
    PPOActorConfig,
    RejectionSamplingConfig,
    StageConfig,
    TrainerConfig,
)
from areal_trainer.config.parts import PolicyLossConfig
from areal_trainer.loss import PolicyLogprobs, PolicyLossInputs, RejectionSettings


def t(rows, dtype=torch.float32) -> torch.Tensor:
    """A ``[B, S]`` tensor from nested lists."""
    return torch.tensor(rows, dtype=dtype)


def mask_of(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def actor_config(validate: bool = True, **kwargs) -> PPOActorConfig:
    """An actor config, validated as a run would validate it (``ConfigError``, a ``ValueError``, listing
    the problems) unless ``validate=False``; the advisory warnings (e.g. decoupled without RS) are silenced."""
    rs = kwargs.pop("rejection_sampling", None)
    loss = kwargs.pop("loss", None)
    if isinstance(rs, dict):
        rs = RejectionSamplingConfig(**rs)
    if isinstance(loss, dict):
        loss = PolicyLossConfig(**{k: StageConfig(**v) for k, v in loss.items()})
    kwargs.setdefault("kl_ctl", 0.0)  # the schema default 0.1 needs a ref section
    cfg = PPOActorConfig(rejection_sampling=rs, loss=loss or PolicyLossConfig(), **kwargs)
    if validate:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            problems = problems_and_build(TrainerConfig(actor=cfg))[0]
        if problems:
            raise ConfigError(problems)
    return cfg


def loss_fn(**kwargs):
    """The policy loss an actor config with these keys binds (``rejection``: a ``RejectionSettings``,
    turned into the ``rejection_sampling`` section)."""
    rs = kwargs.pop("rejection", None)
    if isinstance(rs, RejectionSettings):
        kwargs["rejection_sampling"] = dataclasses.asdict(rs)
    return bind_policy_loss(actor_config(**kwargs))


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
