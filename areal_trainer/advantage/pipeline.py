"""The default advantage computation, a straight line through its stages:

1. overlong length penalty (rollout rewards stay untouched; a penalised copy moves on);
2. outcome shaping (stage ``outcome_reward_shaping``);
3. bias/scale/clip and ``reward_norm`` (group boundaries and logical rollouts from the metadata), or
   the group-baseline stage (``group_baseline``) in its place;
4. temporal estimation (stage ``estimator``) on the next-token-aligned view;
5. ``adv_norm``;
6. process advantage shaping (stage ``process_adv_shaping``), which never touches the returns.

Stages arrive resolved and settings bound (``components/advantage.py``): the built-in steps read only
:class:`~areal_trainer.advantage.settings.AdvantageSettings`, never the config. What user stages return
is validated here, naming the stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from ..errors import PluginOutputError
from . import validation as check
from .align import aligned_mask, aligned_turn_ids, bootstrap_values, old_logprobs, reward_kl, truncation_flags
from .datatypes import (
    AdvantageInputs,
    AdvantageResult,
    GroupBaselineInputs,
    OutcomeRewardInputs,
    ProcessAdvantageInputs,
    TemporalInputs,
)
from .distill import mopd_behavior_logprobs
from .normalize import normalize
from .process import PROCESS_FUNCTIONS, check_process_mode, gvpo_params, split_token_rewards
from .reward import normalize_rewards, overlong_penalty, place_outcome, scale_bias_clip
from .settings import AdvantageSettings

REQUIRED_2D = ("input_ids", "attention_mask", "loss_mask", "logprobs")
OPTIONAL_2D = ("values", "ref_logp", "turn_ids", "token_rewards", "versions")


@dataclass(frozen=True)
class Stage:
    """A resolved stage: its function, bound kwargs, the label errors use, and what the pipeline may
    assume of it (declared by the binding, never inferred from which function it is).

    Attributes:
        builtin: a built-in function (its output is trusted, not validated).
        reads_turn_ids: an estimator that uses turn ids (a token estimator with a static lambda does not,
            so they are not aligned for it).
        takes_prm_params: a process stage whose kwargs are merged with the PRM parameters passed at call
            time (``AdvantageInputs.prm_params``; GVPO).
    """

    label: str
    fn: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    builtin: bool = True
    reads_turn_ids: bool = True
    takes_prm_params: bool = False

    def __call__(self, inputs: Any, **extra: Any) -> Any:
        return self.fn(inputs, **{**self.kwargs, **extra})


@dataclass(frozen=True)
class Stages:
    """The stages and the settings they run with; ``process`` None means ``auto`` (the PRM mode passed at
    call time); ``baseline`` None means ``auto`` (``reward_norm``)."""

    outcome: Stage
    estimator: Stage
    process: Stage | None
    gae_lambda: float | Callable[..., torch.Tensor]
    baseline: Stage | None = None
    settings: AdvantageSettings = field(default_factory=AdvantageSettings)


def check_data(data: Mapping[str, Any], meta) -> tuple[int, int, torch.device]:
    """``(B, S, device)`` after checking the keys and shapes of the rollout batch."""
    missing = [k for k in (*REQUIRED_2D, "rewards") if k not in data]
    if missing:
        raise ValueError(f"the rollout batch lacks {', '.join(map(repr, missing))}.")
    ids = data["input_ids"]
    if ids.dim() != 2 or ids.shape[1] < 1:
        raise ValueError(f"data['input_ids'] must be [B, S] with S >= 1; got {tuple(ids.shape)}.")
    n_rows, width = ids.shape
    for k in (*REQUIRED_2D, *OPTIONAL_2D):
        t = data.get(k)
        if t is None:
            continue
        if k == "token_rewards" and tuple(t.shape) != (n_rows, width):
            raise ValueError(f"token_rewards must match the padded sequence shape {(n_rows, width)}; "
                             f"got {tuple(t.shape)}.")
        if tuple(t.shape) != (n_rows, width) and k != "turn_ids":
            raise ValueError(f"data[{k!r}] must have shape {(n_rows, width)} like input_ids; got {tuple(t.shape)}.")
        if t.device != ids.device:
            raise ValueError(f"data[{k!r}] is on {t.device} but input_ids is on {ids.device}.")
    if tuple(data["rewards"].shape) != (n_rows,):
        raise ValueError(f"data['rewards'] must have shape ({n_rows},) (one reward per row); "
                         f"got {tuple(data['rewards'].shape)}.")
    if meta is not None and meta.n_rows != n_rows:
        raise ValueError(f"meta.traj_group_sizes sum to {meta.n_rows} but the batch has {n_rows} rows.")
    return n_rows, width, ids.device


def run_default(inputs: AdvantageInputs, stages: Stages) -> AdvantageResult:
    """The default computation with the bound ``stages`` (see the module docstring); the batch was checked
    by the caller (:class:`~.stages.AdvantageFn`)."""
    data, cfg, meta = inputs.data, stages.settings, inputs.meta
    n_rows, width = data["input_ids"].shape
    device = data["input_ids"].device
    shape = (n_rows, width)
    penalized, scores = _outcome(inputs, stages, n_rows, device)
    m = aligned_mask(data["loss_mask"])
    seqlen = data["attention_mask"].sum(-1)
    truncated = truncation_flags(data, seqlen, width)
    old = old_logprobs(inputs.old_logprobs, data, m)
    ref = data.get("ref_logp")
    ref = None if ref is None else ref.float() * m
    zeros = torch.zeros(shape, device=device)  # shared by every absent [B, S] input (read-only)
    kl = reward_kl(old, ref, m, kl_ctl=cfg.kl_ctl, estimator=cfg.kl_estimator)
    kl = zeros if kl is None else kl
    rows = scores * (~truncated) if cfg.mask_no_eos_with_zero else scores
    values = data.get("values")
    values = zeros if values is None else values.float()
    raw_ids = data.get("turn_ids")
    token_rewards = data.get("token_rewards")
    # An estimator that does not read turn ids (with a static lambda) is spared aligning them.
    unused = not stages.estimator.reads_turn_ids and not callable(stages.gae_lambda) and token_rewards is None
    ids = None if raw_ids is None or unused else aligned_turn_ids(raw_ids, m)
    direct, folded = None, zeros
    if token_rewards is not None:
        direct, folded = split_token_rewards(
            token_rewards, loss_mask=data["loss_mask"], mask=m, turn_ids=raw_ids, aligned_ids=ids,
            truncated=truncated, zero_truncated=cfg.mask_no_eos_with_zero, as_advantage=cfg.token_rewards_as_adv)
    temporal = TemporalInputs(
        loss_mask=m, outcome_rewards=place_outcome(rows, m), kl_rewards=kl, process_rewards=folded, values=values,
        bootstrap_values=bootstrap_values(values, seqlen), is_truncated=truncated, turn_ids=ids,
        discount=cfg.discount, gae_lambda=stages.gae_lambda, gae_lambda_kwargs=dict(cfg.gae_lambda_kwargs),
        time_unit=cfg.gae_timestep_unit, config=inputs.config,
        absent=frozenset(name for name, t in (("kl_rewards", kl), ("process_rewards", folded), ("values", values))
                         if t is zeros))
    est = stages.estimator(temporal)
    if not stages.estimator.builtin:
        check.check_temporal(est, label=stages.estimator.label, shape=shape, device=device)
    adv = est.advantages.float()
    if cfg.adv_norm is not None:
        adv = normalize(adv, m, cfg.adv_norm, group_sizes=meta.traj_group_sizes if meta else None,
                        member_counts=meta.logical_group_sizes if meta else None, all_reduce=inputs.all_reduce)
    elif not stages.estimator.builtin:
        # built-in estimators and the normalisation already give 0 at masked positions (so only a user
        # estimator's output is masked here)
        adv = adv * m
    adv = _process(inputs, stages, ProcessAdvantageInputs(adv, direct, m, inputs.config), shape, device)
    extras = {"is_truncated": truncated, "input_token_loss_mask": data["loss_mask"]}
    if ref is not None:
        extras["ref_logp"] = ref
    if inputs.mopd:
        extras["mopd_behavior_logprobs"] = mopd_behavior_logprobs(data, m)
    return AdvantageResult(
        advantages=adv, returns=est.returns.float(), loss_mask=m, logprobs=old, outcome_rewards=scores,
        total_rewards=est.total_rewards.float(), kl_rewards=kl, extras=extras,
        metrics={"penalized_rewards": penalized.float()})


def _outcome(inputs: AdvantageInputs, stages: Stages, n_rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(penalised [B], final per-row scores [B])``: steps 1-3."""
    data, cfg, meta = inputs.data, stages.settings, inputs.meta
    raw = data["rewards"]
    penalized = raw
    if cfg.overlong_reward_penalty:
        penalized = overlong_penalty(raw, data["loss_mask"], max_new_tokens=cfg.max_new_tokens,
                                     overlong_tokens=cfg.overlong_tokens, factor=cfg.overlong_penalty_factor)
    view = MappingProxyType({**data, "rewards": penalized})
    stage = stages.outcome
    before = check.tensor_versions(view)
    out = stage(OutcomeRewardInputs(data=view, config=inputs.config, meta=meta))
    check.check_unmodified(stage.label, view, before)
    n_logical = sum(meta.logical_group_sizes) if meta is not None else None
    check.check_outcome(out, label=stage.label, n_rows=n_rows, n_logical=n_logical, device=device,
                        allow_int=stage.builtin)
    if stages.baseline is not None:
        return penalized, _baseline(inputs, stages, out.rewards, n_rows, device)
    norm = cfg.reward_norm
    explicit = meta is not None and any(r is not None for r in meta.logical_rewards)
    norm_on = norm is not None and (norm.mean_level is not None or norm.std_level is not None)
    refs = out.normalization_rewards
    if norm_on and explicit and refs is None and not stage.builtin:
        raise PluginOutputError(f"{stage.label}: the batch carries explicit logical-rollout rewards and reward_norm "
                                "is on, so the outcome stage must return OutcomeResult.normalization_rewards (its "
                                "transform applied to the references in meta.rollout_groups).")
    scores = normalize_rewards(out.rewards, settings=cfg, meta=meta, references=refs,
                               unpenalized=raw if cfg.overlong_reward_penalty else None, all_reduce=inputs.all_reduce)
    return penalized, scores


def _baseline(inputs: AdvantageInputs, stages: Stages, rewards: torch.Tensor, n_rows: int, device) -> torch.Tensor:
    """Step 3 with the group-baseline stage in place of ``reward_norm``."""
    stage, cfg, meta = stages.baseline, stages.settings, inputs.meta
    if meta is not None and any(g is not None for g in meta.rollout_groups):
        raise ValueError(f"{stage.label}: a group-baseline stage sees rows, but this batch carries logical "
                         "rollouts (meta.rollout_groups); use the default group_baseline (reward_norm).")
    scores = scale_bias_clip(rewards, bias=cfg.reward_bias, scale=cfg.reward_scaling, clip=cfg.reward_clip)
    sizes = tuple(meta.traj_group_sizes) if meta is not None else (n_rows,)
    out = stage(GroupBaselineInputs(scores=scores, rewards=rewards.float(), group_sizes=sizes,
                                    loss_mask=inputs.data["loss_mask"], all_reduce=inputs.all_reduce,
                                    config=inputs.config))
    check.check_tensor(stage.label, "the returned scores", out, (n_rows,), device)
    check.check_values(stage.label, {"the returned scores": out})
    return out.float()


def _process(inputs: AdvantageInputs, stages: Stages, pin: ProcessAdvantageInputs, shape, device) -> torch.Tensor:
    """Step 6: the explicit stage, else the PRM mode given at call time, else additive."""
    stage, cfg = stages.process, stages.settings
    if stage is None:
        mode = inputs.prm_mode or "additive"
        check_process_mode(mode, cfg, source="AdvantageInputs.prm_mode")
        kwargs = gvpo_params(inputs.prm_params) if mode == "gvpo" else {}
        return PROCESS_FUNCTIONS[mode](pin, **kwargs)
    if stage.takes_prm_params:
        return stage.fn(pin, **gvpo_params(inputs.prm_params, stage.kwargs))
    if stage.builtin:
        return stage(pin)
    out = stage(pin)
    check.check_process(out, label=stage.label, shape=shape, device=device)
    return out * pin.loss_mask  # masked positions stay 0
