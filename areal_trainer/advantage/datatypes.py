"""Inputs and results of the advantage computation and of its three pluggable stages.

Tensor conventions. ``B`` rows (one right-padded sequence each) of padded width ``S``.

* Rollout tensors in ``data`` are **token-aligned**: position ``t`` describes token ``x_t``
  (``input_ids``, ``attention_mask``, ``loss_mask``, behaviour ``logprobs``, ``turn_ids``,
  ``token_rewards``, ``versions``); ``rewards`` and ``is_truncated`` are ``[B]``.
* Model forwards (``values``, ``ref_logp``) and every result are **next-token aligned**:
  position ``t`` is about predicting ``x_{t+1}``. The aligned ``loss_mask[t]`` is the rollout mask of
  ``t + 1``; its last column is always 0.

Every dataclass here is frozen: stages return new values and never mutate their inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

EXTRAS_WHITELIST = frozenset(
    {"input_token_loss_mask", "is_truncated", "mopd_behavior_logprobs", "prox_logp", "ref_logp"}
)
"""The only keys ``AdvantageResult.extras`` may carry (it must never overwrite rollout fields)."""


@dataclass(frozen=True)
class RolloutGroup:
    """How one prompt's tensor rows split into logical rollouts (agentic "individual" export).

    Attributes:
        row_counts: rows of each logical rollout, in row order; positive ints, at least one.
        rewards: one explicit reference reward per logical rollout, or None where not supplied
            (then all rows of that rollout must carry the same reward). Defaults to all None.
    """

    row_counts: tuple[int, ...]
    rewards: tuple[float | None, ...] = ()

    def __post_init__(self) -> None:
        counts = tuple(self.row_counts)
        if not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
            raise ValueError(f"RolloutGroup.row_counts must be a non-empty tuple of positive ints; got {counts!r}.")
        rewards = tuple(self.rewards) if self.rewards else (None,) * len(counts)
        if len(rewards) != len(counts):
            raise ValueError(f"RolloutGroup.rewards has {len(rewards)} entries for {len(counts)} logical rollouts.")
        for r in rewards:
            if r is not None and not math.isfinite(float(r)):
                raise ValueError(f"RolloutGroup.rewards must be finite or None; got {r!r}.")
        object.__setattr__(self, "row_counts", counts)
        object.__setattr__(self, "rewards", tuple(None if r is None else float(r) for r in rewards))


@dataclass(frozen=True)
class TrajBatchMeta:
    """Grouping of the rows of a concatenated batch (one entry per prompt).

    Attributes:
        traj_group_sizes: tensor rows contributed by each prompt; positive, summing to ``B``.
        rollout_groups: per prompt, its ``RolloutGroup`` or None (then every row is its own
            logical rollout). Defaults to all None.
        logical_group_sizes: logical rollouts per prompt; derived from ``rollout_groups`` when
            omitted, and checked against them when given.
    """

    traj_group_sizes: tuple[int, ...]
    rollout_groups: tuple[RolloutGroup | None, ...] | None = None
    logical_group_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        sizes = tuple(self.traj_group_sizes)
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"traj_group_sizes must be all positive ints; got {sizes!r}.")
        groups = tuple(self.rollout_groups) if self.rollout_groups is not None else (None,) * len(sizes)
        if len(groups) != len(sizes):
            raise ValueError(f"rollout_groups has {len(groups)} entries for {len(sizes)} prompts.")
        derived = []
        for i, (n, g) in enumerate(zip(sizes, groups)):
            if g is not None and sum(g.row_counts) != n:
                raise ValueError(f"rollout_groups[{i}].row_counts sum to {sum(g.row_counts)} but prompt {i} "
                                 f"has {n} rows.")
            derived.append(n if g is None else len(g.row_counts))
        if self.logical_group_sizes is not None and tuple(self.logical_group_sizes) != tuple(derived):
            raise ValueError(f"logical_group_sizes {tuple(self.logical_group_sizes)} do not match the rollout "
                             f"groups {tuple(derived)}.")
        object.__setattr__(self, "traj_group_sizes", sizes)
        object.__setattr__(self, "rollout_groups", groups)
        object.__setattr__(self, "logical_group_sizes", tuple(derived))

    @property
    def n_rows(self) -> int:
        return sum(self.traj_group_sizes)

    @property
    def logical_row_counts(self) -> tuple[int, ...]:
        """Rows of every logical rollout of the batch, in row order (length ``sum(logical_group_sizes)``)."""
        out: list[int] = []
        for n, g in zip(self.traj_group_sizes, self.rollout_groups):
            out += [1] * n if g is None else list(g.row_counts)
        return tuple(out)

    @property
    def logical_rewards(self) -> tuple[float | None, ...]:
        """The explicit reference reward of every logical rollout, None where not supplied."""
        out: list[float | None] = []
        for n, g in zip(self.traj_group_sizes, self.rollout_groups):
            out += [None] * n if g is None else list(g.rewards)
        return tuple(out)


@dataclass(frozen=True)
class OutcomeRewardInputs:
    """Input of the outcome stage: ``data`` is the read-only rollout mapping after the length penalty."""

    data: Mapping[str, Any]
    config: Any
    meta: TrajBatchMeta | None


@dataclass(frozen=True)
class OutcomeResult:
    """Output of the outcome stage.

    Attributes:
        rewards: ``[B]`` one float reward per row, same row order and device as the input.
        normalization_rewards: ``[L]`` one shaped reference per logical rollout
            (``L = sum(meta.logical_group_sizes)``), before bias/scale/clip; required when the batch
            carries explicit logical-rollout rewards and ``reward_norm`` is on.
    """

    rewards: torch.Tensor
    normalization_rewards: torch.Tensor | None = None


@dataclass(frozen=True)
class GroupBaselineInputs:
    """Input of the group-baseline stage (``actor.advantage.group_baseline``), which replaces
    ``reward_norm``: it turns each row's score into its share of the outcome advantage, usually by
    subtracting a baseline computed over the row's group (the prompt's answers) and scaling.

    Attributes:
        scores: ``[B]`` float32 rewards after the length penalty, the outcome stage and
            bias/scale/clip (``reward_bias``, ``reward_scaling``, ``reward_clip``).
        rewards: ``[B]`` the same rewards before bias/scale/clip (e.g. to tell right answers by ``> 0``).
        group_sizes: rows per prompt group, in row order (they sum to ``B``).
        loss_mask: ``[B, S]`` the token-aligned rollout loss mask (answer lengths are its row sums).
        all_reduce: sums a tensor over the data-parallel group (identity when None), for batch statistics.
        config: the actor config.
    """

    scores: torch.Tensor
    rewards: torch.Tensor
    group_sizes: tuple[int, ...]
    loss_mask: torch.Tensor
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None
    config: Any


@dataclass(frozen=True)
class TemporalInputs:
    """Input of the estimator stage; every tensor is next-token aligned.

    Attributes:
        loss_mask: ``[B, S]`` float 0/1, aligned.
        outcome_rewards: ``[B, S]`` the row's final reward at its last active position, 0 elsewhere.
        kl_rewards: ``[B, S]`` ``-kl_ctl * KL`` per active position, 0 elsewhere.
        process_rewards: ``[B, S]`` folded turn-end process rewards (zeros unless
            ``token_rewards_as_adv=false``).
        values: ``[B, S]`` critic values (zeros without a critic).
        bootstrap_values: ``[B]`` value after each row's last real token, ``V[b, seqlen_b - 1]``.
        is_truncated: ``[B]`` bool; only truncated rows bootstrap.
        turn_ids: ``[B, S]`` int32/int64 aligned turn ids (validated against ``loss_mask`` before use), or
            None without rollout ``turn_ids`` (the built-in token estimator with a static lambda,
            which never reads them, also gets None).
        discount: gamma.
        gae_lambda: a float or the resolved lambda function (pass it to ``compute_gae_lambda``).
        gae_lambda_kwargs: keyword arguments of a lambda function.
        time_unit: ``actor.gae_timestep_unit``.
        config: the actor config.
        absent: names of the ``[B, S]`` inputs above that nothing produced for this batch, all zeros:
            ``kl_rewards`` (no reference or ``kl_ctl`` 0), ``process_rewards`` (none folded), ``values`` (no
            critic). An estimator may skip its arithmetic with them.
    """

    loss_mask: torch.Tensor
    outcome_rewards: torch.Tensor
    kl_rewards: torch.Tensor
    process_rewards: torch.Tensor
    values: torch.Tensor
    bootstrap_values: torch.Tensor
    is_truncated: torch.Tensor
    turn_ids: torch.Tensor | None
    discount: float
    gae_lambda: float | Callable[..., torch.Tensor]
    gae_lambda_kwargs: Mapping[str, Any]
    time_unit: str
    config: Any = None
    absent: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TemporalResult:
    """``advantages``, ``returns`` (critic targets) and ``total_rewards`` (monitoring), all ``[B, S]``."""

    advantages: torch.Tensor
    returns: torch.Tensor
    total_rewards: torch.Tensor


@dataclass(frozen=True)
class ProcessAdvantageInputs:
    """Input of the process stage.

    Attributes:
        advantages: ``[B, S]`` after ``adv_norm``.
        token_rewards: ``[B, S]`` aligned direct process rewards (0 where inactive), or None.
        loss_mask: ``[B, S]`` float 0/1, aligned.
        config: the actor config.
    """

    advantages: torch.Tensor
    token_rewards: torch.Tensor | None
    loss_mask: torch.Tensor
    config: Any


@dataclass(frozen=True)
class AdvantageInputs:
    """Input of the whole computation.

    Attributes:
        data: the rollout batch (see the module docstring); never modified.
        config: the actor config (``PPOActorConfig``).
        meta: row grouping, or None (then ``NormConfig.group_size`` strides are the fallback).
        prm_mode: process shaping mode chosen by the PRM setup (``additive``, ``gvpo``,
            ``process_weighted``); used when ``process_adv_shaping`` is null or ``auto``.
        prm_params: GVPO parameters of the PRM setup (``negative_scale``, ``zero_penalty``, ``zero_eps``).
        all_reduce: sums a tensor over the data-parallel group (identity when None); batch-level
            statistics use it.
        old_logprobs: ``[B, S]`` next-token-aligned log pi_old, the policy the KL reward is taken
            from and the loss's behaviour policy: the trainer passes what ``train/policies.py``
            chose (the engine's logprobs, or their recomputation with ``recompute_logprob`` and no
            decoupled loss). None: the behaviour ``logprobs`` of ``data``, aligned.
        mopd: MOPD (multi-teacher distillation, ``teacher``) is on: the result must carry
            ``extras["mopd_behavior_logprobs"]``, the rollout's ``logprobs`` rolled into alignment and masked
            (``advantage.distill.mopd_behavior_logprobs``); a full replacement stores them itself.
    """

    data: Mapping[str, Any]
    config: Any
    meta: TrajBatchMeta | None = None
    prm_mode: str | None = None
    prm_params: Mapping[str, float] | None = None
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
    old_logprobs: torch.Tensor | None = None
    mopd: bool = False


@dataclass(frozen=True)
class AdvantageResult:
    """Output of the whole computation; ``[B, S]`` tensors are next-token aligned.

    Attributes:
        advantages: ``[B, S]`` float, 0 where ``loss_mask`` is 0.
        returns: ``[B, S]`` critic targets.
        loss_mask: ``[B, S]`` binary float, aligned.
        logprobs: ``[B, S]`` pi_old, masked.
        outcome_rewards: ``[B]`` per-row reward after shaping, scale/bias/clip and ``reward_norm``.
        total_rewards: ``[B, S]`` per-token reward for monitoring.
        kl_rewards: ``[B, S]`` ``-kl_ctl * KL`` per token.
        extras: optional tensors, keys limited to ``EXTRAS_WHITELIST``.
        metrics: optional per-row ``[B]`` or 0-dim tensors for logging (never fed to the loss).
    """

    advantages: torch.Tensor
    returns: torch.Tensor
    loss_mask: torch.Tensor
    logprobs: torch.Tensor
    outcome_rewards: torch.Tensor
    total_rewards: torch.Tensor
    kl_rewards: torch.Tensor
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)
    metrics: Mapping[str, torch.Tensor] = field(default_factory=dict)
