"""Builders for small rollout batches and actor configs used across the advantage tests."""

from __future__ import annotations

import torch

from areal_trainer.advantage import AdvantageInputs
from areal_trainer.components import problems_and_build
from areal_trainer.components.advantage import bind_advantage
from areal_trainer.config import AdvantageConfig, NormConfig, PPOActorConfig, StageConfig, TrainerConfig

T = torch.tensor


def actor(**kw) -> PPOActorConfig:
    """An actor config with KL off unless asked for (the schema default is 0.1).

    ``advantage`` may be a dict of stage name -> ``{implementation, kwargs}`` (or None).
    """
    kw.setdefault("kl_ctl", 0.0)
    if isinstance(kw.get("advantage"), dict):
        kw["advantage"] = advantage(**kw["advantage"])
    return PPOActorConfig(**kw)


def advantage(**stages) -> AdvantageConfig:
    built = {k: None if v is None else StageConfig(**v) for k, v in stages.items()}
    return AdvantageConfig(**built)


def norm(mean=None, std=None, **kw) -> NormConfig:
    return NormConfig(mean_level=mean, std_level=std, **kw)


def batch(loss_mask, rewards, *, attention_mask=None, logprobs=None, **extra) -> dict:
    """A rollout batch from a ``[B, S]`` loss mask and ``[B]`` rewards (everything else zeros/ones)."""
    lm = torch.as_tensor(loss_mask)
    if lm.dim() == 1:
        lm = lm[None]
    data = {
        "input_ids": torch.zeros(lm.shape, dtype=torch.long),
        "attention_mask": torch.ones(lm.shape, dtype=torch.long) if attention_mask is None
        else torch.as_tensor(attention_mask).reshape(lm.shape),
        "loss_mask": lm,
        "logprobs": torch.zeros(lm.shape) if logprobs is None else torch.as_tensor(logprobs).reshape(lm.shape).float(),
        "rewards": torch.as_tensor(rewards).reshape(-1),
    }
    for k, v in extra.items():
        v = torch.as_tensor(v)
        data[k] = v.reshape(lm.shape) if v.numel() == lm.numel() and k != "is_truncated" else v
    return data


def run(data, cfg=None, **inputs):
    """The advantage of ``data`` as ``cfg`` (an actor config) binds it."""
    cfg = cfg or actor()
    return bind_advantage(cfg)(AdvantageInputs(data, cfg, **inputs))


def problems_of(cfg: PPOActorConfig) -> list[str]:
    """Every problem a run with this actor config reports at start-up (``components.build``)."""
    return problems_and_build(TrainerConfig(actor=cfg))[0]


def close(actual, expected, atol=1e-5):
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert torch.allclose(actual.double(), expected.reshape(actual.shape), atol=atol), f"{actual} != {expected}"
