"""The settings the built-in advantage stages read, bound once at start-up (``components/advantage.py``).
This module imports nothing (no torch): the schema builds its normalisation sections on :class:`Norm`.

The stages never read a config object: they read one frozen :class:`AdvantageSettings`, whose field
names are the actor keys they come from (``reward_bias``, ``adv_norm``, ``gae_timestep_unit``, ...), so
a plugin author can see every setting a built-in stage depends on in one place. The inputs of the
stages still carry the actor config as ``config`` for user stages (the seed API).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Optional


@dataclass
class Norm:
    """Normalisation of rewards (``[B]``) or advantages (``[B, S]``): ``(x - mean) / (std + eps)``."""

    mean_level: Optional[str] = "batch"
    """Where the centring mean comes from: ``batch``, ``group`` (rows of one prompt) or null (no centring)."""
    mean_leave1out: bool = False
    """Leave-one-out mean: each element is centred by the mean of the *other* elements (RLOO)."""
    std_level: Optional[str] = "batch"
    """Where the scaling std comes from: ``batch``, ``group`` or null (no scaling, and no eps)."""
    std_unbiased: bool = True
    """Bessel's correction (divide by n-1)."""
    eps: float = 1e-5
    """Added to the std in the denominator."""
    group_size: int = 1
    """Rows per group, used only when the batch carries no group metadata (then it must divide the batch)."""

    @property
    def uses_group_statistics(self) -> bool:
        return self.mean_level == "group" or self.std_level == "group"


def norm_of(cfg: Any) -> Norm | None:
    """A bound copy of a normalisation section (``actor.reward_norm``, ``actor.adv_norm``), or None: the
    settings never share an object with the configuration."""
    if cfg is None:
        return None
    return Norm(**{f.name: getattr(cfg, f.name) for f in fields(Norm)})


@dataclass(frozen=True)
class AdvantageSettings:
    """Everything the default advantage computation reads besides its stages (defaults: AReaL's).

    Rewards: ``clip((r + reward_bias) * reward_scaling, -reward_clip, reward_clip)``, then ``reward_norm``;
    DAPO's overlong penalty over the last ``overlong_tokens`` of ``max_new_tokens``
    (``overlong_reward_penalty``); ``mask_no_eos_with_zero`` zeroes truncated rows' outcome.
    KL: ``kl_ctl`` times the ``kl_estimator`` estimate against the reference policy, in the rewards.
    Temporal: ``discount`` (gamma), ``gae_lambda_kwargs`` (of a lambda function), ``gae_timestep_unit``.
    Then ``adv_norm``; ``token_rewards_as_adv``: process rewards added to the advantages (true) or folded
    into GAE (false).
    """

    reward_bias: float = 0.0
    reward_scaling: float = 1.0
    reward_clip: float = 20.0
    reward_norm: Norm | None = None
    overlong_reward_penalty: bool = False
    overlong_tokens: int | None = None
    overlong_penalty_factor: float | None = None
    max_new_tokens: int = 1024
    mask_no_eos_with_zero: bool = False
    kl_ctl: float = 0.0
    kl_estimator: str = "k1"
    discount: float = 1.0
    gae_lambda_kwargs: Mapping[str, Any] = field(default_factory=dict)
    gae_timestep_unit: str = "token"
    adv_norm: Norm | None = None
    token_rewards_as_adv: bool = True
