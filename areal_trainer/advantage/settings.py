"""The settings the built-in advantage stages read, bound once at start-up (``components/advantage.py``).

The stages never read a config object: they read one frozen :class:`AdvantageSettings`, whose field
names are the actor keys they come from (``reward_bias``, ``adv_norm``, ``gae_timestep_unit``, ...), so
a plugin author can see every setting a built-in stage depends on in one place. The inputs of the
stages still carry the actor config as ``config`` for user stages (the seed API).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Norm:
    """``(x - mean) / (std + eps)`` over a batch or a group (``actor.reward_norm``, ``actor.adv_norm``).

    Attributes:
        mean_level: ``batch``, ``group`` or None (no centring).
        mean_leave1out: centre each element by the mean of the *other* elements (RLOO).
        std_level: ``batch``, ``group`` or None (no scaling and no eps).
        std_unbiased: Bessel's correction.
        eps: added to the std in the denominator.
        group_size: rows per group when the batch carries no group metadata.
    """

    mean_level: str | None = "batch"
    mean_leave1out: bool = False
    std_level: str | None = "batch"
    std_unbiased: bool = True
    eps: float = 1e-5
    group_size: int = 1

    @property
    def uses_group_statistics(self) -> bool:
        return self.mean_level == "group" or self.std_level == "group"

    @classmethod
    def of(cls, cfg: Any) -> Norm | None:
        """The settings of a normalisation section (any object with these attributes), or None."""
        if cfg is None:
            return None
        return cls(mean_level=cfg.mean_level, mean_leave1out=bool(cfg.mean_leave1out), std_level=cfg.std_level,
                   std_unbiased=bool(cfg.std_unbiased), eps=float(cfg.eps), group_size=int(cfg.group_size))


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
