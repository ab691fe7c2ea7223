"""One RL step on a collected batch: the extra forwards (proximal policy, reference policy,
critic values), the advantage, and the policy update. Pure orchestration: the math lives in
``advantage`` and ``loss``, the forward in ``train/logprobs.py``.
"""

from __future__ import annotations

import torch

from ..advantage import AdvantageInputs, AdvantageResult, TrajBatchMeta
from ..loss import PolicyLogprobs, PolicyLossInputs, explained_variance, loss_normalizer, value_loss
from ..model.prefix import GroupPrefix
from ..rollout.batch import select_rows
from .logprobs import forward_logprobs
from .update import micro_batches, optimizer_steps


@torch.no_grad()
def batched_logprobs(model, batch: dict, *, temperature: float, mb_spec, autocast_dtype,
                     prefix: GroupPrefix | None = None) -> torch.Tensor:
    """``[B, S]`` next-token log-probabilities of ``batch`` under ``model``, micro-batch by micro-batch;
    with ``prefix`` (the batch's prompt groups) each micro-batch's common prefixes are computed once."""
    out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32, device=batch["input_ids"].device)
    lengths = batch["attention_mask"].sum(1).tolist()
    for rows in micro_batches(list(range(len(lengths))), lengths, mb_spec, prefix):
        idx = torch.tensor(rows, device=out.device)
        sub = select_rows({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}, idx)
        logp, _ = forward_logprobs(model, sub["input_ids"], sub["attention_mask"], temperature=temperature,
                                   autocast_dtype=autocast_dtype, prefix_sharing=prefix is not None)
        out[idx, : logp.shape[1]] = logp
    return out


@torch.no_grad()
def batched_values(critic, batch: dict, *, mb_spec, autocast_dtype, prefix: GroupPrefix | None = None) -> torch.Tensor:
    """``[B, S]`` critic values of ``batch``, micro-batch by micro-batch (``prefix``: as in :func:`batched_logprobs`)."""
    out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32, device=batch["input_ids"].device)
    lengths = batch["attention_mask"].sum(1).tolist()
    for rows in micro_batches(list(range(len(lengths))), lengths, mb_spec, prefix):
        idx = torch.tensor(rows, device=out.device)
        sub = select_rows({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}, idx)
        out[idx, : sub["input_ids"].shape[1]] = critic(sub["input_ids"], sub["attention_mask"], autocast_dtype,
                                                       prefix_sharing=prefix is not None)
    return out


def critic_update(critic, optimizer, data: dict, adv: AdvantageResult, *, critic_cfg, autocast_dtype,
                  all_reduce=None, sync_grads=None, n_minibatches: int | None = None,
                  prefix: GroupPrefix | None = None) -> tuple[dict[str, float], int]:
    """``critic.ppo_n_minibatches`` optimizer steps of the clipped value loss towards ``adv.returns``
    (``prefix``: the batch's prompt groups under shared-prefix training)."""
    batch = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"], "loss_mask": adv.loss_mask,
             "old_values": data["values"], "returns": adv.returns}

    def normalizer_of(sub: dict) -> torch.Tensor:
        return loss_normalizer(sub["loss_mask"], "token-mean")

    def loss_of(sub: dict, normalizer: torch.Tensor):
        values = critic(sub["input_ids"], sub["attention_mask"], autocast_dtype, prefix_sharing=prefix is not None)
        return value_loss(values, sub["old_values"], sub["returns"], sub["loss_mask"], critic_cfg.eps_clip,
                          normalizer=normalizer)

    metrics, skipped = optimizer_steps(
        batch, model=critic, optimizer=optimizer, n_minibatches=n_minibatches or critic_cfg.ppo_n_minibatches,
        mb_spec=critic_cfg.mb_spec, grad_clip=critic_cfg.optimizer.gradient_clipping, normalizer_of=normalizer_of,
        loss_of=loss_of, all_reduce=all_reduce, sync_grads=sync_grads, prefix=prefix)
    metrics = {k.replace("update/", "critic/update/"): v for k, v in metrics.items()}
    # How well the values the advantages were computed with predicted the returns (whole batch).
    metrics["critic/explained_variance_before_update"] = float(
        explained_variance(data["values"], adv.returns, adv.loss_mask))
    return metrics, skipped


def compute_advantage(advantage_fn, data: dict, actor_cfg, group_sizes: list[int], all_reduce=None,
                      old_logprobs: torch.Tensor | None = None) -> AdvantageResult:
    meta = TrajBatchMeta(traj_group_sizes=tuple(group_sizes))
    return advantage_fn(AdvantageInputs(data=data, config=actor_cfg, meta=meta, all_reduce=all_reduce,
                                        old_logprobs=old_logprobs))


def training_batch(data: dict, adv: AdvantageResult, policies: PolicyLogprobs) -> dict[str, torch.Tensor]:
    """What the policy update needs, all ``[B, S]`` and next-token aligned, split by rows into
    minibatches and micro-batches (``old_logp``/``prox_logp``/``versions`` are ``policies``' tensors)."""
    batch = {
        "input_ids": data["input_ids"], "attention_mask": data["attention_mask"],
        "loss_mask": adv.loss_mask, "advantages": adv.advantages,
        "old_logp": policies.behavior, "versions": policies.versions,
    }
    if policies.proximal is not None:
        batch["prox_logp"] = policies.proximal
    return batch


def policy_update(model, optimizer, batch: dict, *, loss_fn, actor_cfg, version: int, autocast_dtype,
                  all_reduce=None, sync_grads=None, n_minibatches: int | None = None,
                  prefix: GroupPrefix | None = None) -> tuple[dict[str, float], int]:
    """``actor.ppo_n_minibatches`` optimizer steps of the policy; returns (metrics, skipped steps).
    ``prefix``: the batch's prompt groups under shared-prefix training."""

    def normalizer_of(sub: dict) -> torch.Tensor:
        return loss_normalizer(sub["loss_mask"], actor_cfg.loss_agg_mode)

    def loss_of(sub: dict, normalizer: torch.Tensor):
        logp, entropy = forward_logprobs(model, sub["input_ids"], sub["attention_mask"],
                                         temperature=actor_cfg.temperature, with_entropy=True,
                                         autocast_dtype=autocast_dtype, prefix_sharing=prefix is not None)
        policies = PolicyLogprobs(behavior=sub["old_logp"], proximal=sub.get("prox_logp"),
                                  versions=sub["versions"], current_version=version)
        inputs = PolicyLossInputs(logprobs=logp, policies=policies, advantages=sub["advantages"],
                                  loss_mask=sub["loss_mask"], entropy=entropy)
        result = loss_fn(inputs, normalizer=normalizer)
        return result.loss, result.stats

    opt_cfg = actor_cfg.optimizer
    return optimizer_steps(batch, model=model, optimizer=optimizer,
                           n_minibatches=n_minibatches or actor_cfg.ppo_n_minibatches, mb_spec=actor_cfg.mb_spec,
                           grad_clip=opt_cfg.gradient_clipping, normalizer_of=normalizer_of, loss_of=loss_of,
                           all_reduce=all_reduce, sync_grads=sync_grads, prefix=prefix)


def rollout_metrics(data: dict, adv: AdvantageResult) -> dict[str, float]:
    """Per-step statistics of the sampled batch and its advantages."""
    answer_len = data["loss_mask"].sum(1).float()
    rewards = data["rewards"].float()
    m = adv.loss_mask.bool()
    out = {
        "reward/task": float(rewards.mean()),
        "reward/correct_frac": float((rewards > 0).float().mean()),
        "rollout/answer_len": float(answer_len.mean()),
        "rollout/seq_len": float(data["attention_mask"].sum(1).float().mean()),
        "rollout/truncated_frac": float(data["is_truncated"].float().mean()),
        "rollout/rows": float(rewards.numel()),
        "advantage/mean": float(adv.advantages[m].mean()) if m.any() else 0.0,
        "advantage/abs_mean": float(adv.advantages[m].abs().mean()) if m.any() else 0.0,
        "advantage/kl_reward": float(adv.kl_rewards[m].mean()) if m.any() else 0.0,
    }
    if "num_turns" in data:
        out["rollout/num_turns"] = float(data["num_turns"].float().mean())
    correct = rewards > 0
    if correct.any():
        out["rollout/correct_answer_len"] = float(answer_len[correct].mean())
    if (~correct).any():
        out["rollout/incorrect_answer_len"] = float(answer_len[~correct].mean())
    return out
