"""One RL step, top to bottom: rollout -> extra forwards -> advantage -> updates. Pure orchestration:
the maths lives in ``advantage/`` and ``loss/``, the models in ``models/policy.py`` and ``models/critic.py``;
the loop around it (``loop.py``) advances the policy version, evaluates, logs and saves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..advantage import AdvantageInputs, AdvantageResult, RolloutGroup, TrajBatchMeta
from ..advantage.distill import add_distill_advantage, distillation_only
from ..metrics import Mean, Metric, Sum
from ..model.prefix import group_prefix
from ..reward import is_correct
from . import policies
from .batch import CriticBatch, TrainBatch, UpdateBatch

if TYPE_CHECKING:
    from ..advantage.stages import AdvantageFn
    from ..components.distill import DistillSpec
    from ..config.actor import PPOActorConfig
    from ..dist import DistContext
    from ..loss.types import PolicyLossResult, PolicyPlan
    from .models.critic import CriticModel
    from .models.policy import PolicyModel, ReferenceModel
    from .models.teacher import Teachers
    from .sources.build import RolloutSource


@dataclass
class StepContext:
    """What a step works with, built once (``run.py``): the models, the rollout source, the bound advantage,
    loss and policy plan, the process group, and the few settings the step itself reads."""

    policy: PolicyModel
    reference: ReferenceModel | None
    """The frozen reference policy, or None when no KL term or statistic needs it."""
    critic: CriticModel | None
    """The value model of PPO, or None for critic-free algorithms."""
    source: RolloutSource
    advantage: AdvantageFn
    loss: Callable[..., PolicyLossResult]
    """The bound policy loss (``components/loss.py``), the distillation term already in it."""
    plan: PolicyPlan
    dist: DistContext
    device: torch.device
    actor_config: PPOActorConfig
    """Handed to the advantage stages as ``AdvantageInputs.config`` (user stages read it); the step itself reads
    no setting from it."""
    n_minibatches: int
    critic_minibatches: int
    max_staleness: int
    teachers: Teachers | None = None
    """The loaded teachers (``models/teacher.py``), or None without distillation."""
    distill: DistillSpec | None = None
    """The bound ``teacher`` section (``components/distill.py``): the loss form and its weights."""


@dataclass
class StepResult:
    """A step's metrics, the prompts it trained on, and whether every optimizer step was skipped."""

    metrics: dict[str, Metric] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    all_skipped: bool = False
    batch: TrainBatch | None = None
    advantages: AdvantageResult | None = None
    """The advantage stage's output for the batch trained on (None for a skipped step)."""

    @property
    def tokens(self) -> int:
        """Real tokens trained on (0 for a step with nothing to train on)."""
        return 0 if self.batch is None else int(self.batch.attention_mask.sum())


def train_step(ctx: StepContext, version: int) -> StepResult:
    t0 = time.time()
    with ctx.policy.generating():
        rollout = ctx.source.next_batch(version)
    metrics = dict(rollout.metrics)
    # Nothing to train on (dynamic_bs, no group accepted): every process skips the step together.
    if ctx.dist.any(not rollout.groups):
        return StepResult({**metrics, "update/skipped_empty_batch": Sum(1.0), "time/rollout": Mean(time.time() - t0)})
    batch = TrainBatch.from_groups(rollout.groups, ctx.device)
    t1 = time.time()
    groups = group_prefix(batch.input_ids, batch.attention_mask, batch.group_sizes) if ctx.policy.share or (
        ctx.critic is not None and ctx.critic.share) or (ctx.reference is not None and ctx.reference.share) or (
        ctx.teachers is not None and ctx.teachers.any_share) else None
    logps = policies.prepare(ctx.plan, batch.logprobs, batch.versions,
                             lambda: ctx.policy.logprobs(batch.input_ids, batch.attention_mask, groups, batch.vision))
    ref_logp = None if ctx.reference is None else ctx.reference.logprobs(batch.input_ids, batch.attention_mask, groups,
                                                                         batch.vision)
    teacher = None
    if ctx.teachers is not None:  # the teachers score exactly the rows this step trains on
        t_teacher = time.time()
        teacher, teacher_metrics = ctx.teachers.score(batch, groups, step=version + 1)
        metrics.update({**teacher_metrics, "time/teacher": Mean(time.time() - t_teacher)})
    values = None if ctx.critic is None else ctx.critic.values(batch.input_ids, batch.attention_mask, groups,
                                                               batch.vision)
    t2 = time.time()
    adv = advantages(ctx, AdvantageInputs(
        data=batch.rollout_data(ref_logp=ref_logp, values=values), config=ctx.actor_config,
        meta=batch_meta(batch), all_reduce=ctx.dist.sum_fn(), old_logprobs=logps.old,
        mopd=ctx.distill is not None and ctx.distill.mopd), teacher)
    rows = int(ctx.dist.all_reduce(torch.tensor(batch.n_rows), "min"))  # every process runs as many steps
    t3 = time.time()
    update = ctx.policy.update(
        UpdateBatch(batch.input_ids, batch.attention_mask, adv.loss_mask, adv.advantages,
                    policies.for_loss(ctx.plan, logps, adv, version, teacher), batch.vision),
        groups, loss_fn=ctx.loss, version=version, n_minibatches=min(ctx.n_minibatches, rows),
        all_reduce=ctx.dist.sum_fn(), sync_grads=ctx.dist.gradient_sync())
    metrics.update(update.metrics)
    if ctx.critic is not None:
        metrics.update(ctx.critic.update(
            CriticBatch(batch.input_ids, batch.attention_mask, adv.loss_mask, values, adv.returns, batch.vision),
            groups,
            n_minibatches=min(ctx.critic_minibatches, rows), all_reduce=ctx.dist.sum_fn(),
            sync_grads=ctx.dist.gradient_sync()).metrics)
    metrics.update(policies.policy_metrics(logps, adv.loss_mask, version, ctx.max_staleness))
    metrics.update(rollout_metrics(batch, adv))
    t4 = time.time()
    metrics.update({"time/rollout": Mean(t1 - t0), "time/logprobs": Mean(t2 - t1), "time/advantage": Mean(t3 - t2),
                    "time/update": Mean(t4 - t3)})
    return StepResult(metrics, rollout.prompt_ids, update.all_skipped, batch, adv)


def advantages(ctx: StepContext, inputs: AdvantageInputs, teacher) -> AdvantageResult:
    """The bound advantage; with a teacher: skipped for pure distillation (no reward, no GAE: AReaL's
    rule), and for the ``advantage`` form with the distillation term added (``advantage/distill.py``)."""
    d = ctx.distill
    adv = distillation_only(inputs) if d is not None and d.pure else ctx.advantage(inputs)
    if d is not None and d.form == "advantage":
        adv = add_distill_advantage(adv, teacher.logp, rl_weight=d.rl_weight, coef=d.distill_weight)
    return adv


def batch_meta(batch: TrainBatch) -> TrajBatchMeta:
    """The batch's grouping for the advantage: its prompt groups and, for agents' per-call rows, the episodes
    within them (group statistics then count each episode once, with its reward)."""
    if not batch.episodes:
        return TrajBatchMeta(traj_group_sizes=batch.group_sizes)
    return TrajBatchMeta(traj_group_sizes=batch.group_sizes, rollout_groups=tuple(
        None if e is None else RolloutGroup(row_counts=e[0], rewards=e[1]) for e in batch.episodes))


def rollout_metrics(batch: TrainBatch, adv) -> dict[str, Metric]:
    """Per-step statistics of the sampled batch and its advantages (means over rows or trained tokens)."""
    answer_len = batch.loss_mask.sum(1).float()
    rewards = batch.rewards.float()
    m = adv.loss_mask.bool()
    n_rows, n_tok = float(rewards.numel()), float(m.sum())
    out = {
        "reward/task": Mean(float(rewards.mean()), n_rows),
        "reward/correct_frac": Mean(float(is_correct(rewards).float().mean()), n_rows),
        "rollout/answer_len": Mean(float(answer_len.mean()), n_rows),
        "rollout/seq_len": Mean(float(batch.attention_mask.sum(1).float().mean()), n_rows),
        "rollout/truncated_frac": Mean(float(batch.is_truncated.float().mean()), n_rows),
        "rollout/rows": Sum(n_rows),
        "advantage/mean": Mean(float(adv.advantages[m].mean()) if m.any() else 0.0, n_tok),
        "advantage/abs_mean": Mean(float(adv.advantages[m].abs().mean()) if m.any() else 0.0, n_tok),
        "advantage/kl_reward": Mean(float(adv.kl_rewards[m].mean()) if m.any() else 0.0, n_tok),
    }
    if batch.num_turns is not None:
        out["rollout/num_turns"] = Mean(float(batch.num_turns.float().mean()), n_rows)
    correct = is_correct(rewards)
    if correct.any():
        out["rollout/correct_answer_len"] = Mean(float(answer_len[correct].mean()), float(correct.sum()))
    if (~correct).any():
        out["rollout/incorrect_answer_len"] = Mean(float(answer_len[~correct].mean()), float((~correct).sum()))
    return out
