"""The training loop. Each step: rollout (generate + reward) -> extra forwards -> advantage ->
policy update -> evaluation / checkpoint -> metrics. ``run(cfg, run_dir)`` is the whole job.

Under FSDP2 (``fsdp.py``) the policy and critic are sharded once the reference policy and critic
have been copied from the whole policy (``_build_aux_models``); generation and the no-grad
forwards run with the weights gathered (``fsdp.gathered``), checkpoints hold the full weights.
"""

from __future__ import annotations

import os
import random
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import fsdp
from ..advantage.stages import resolve_advantage
from ..config.schema import TrainerConfig
from ..data.datasets import build_samples
from ..data.loader import PromptLoader
from ..dist import init_distributed
from ..errors import UserError
from ..loss import bind_policy_loss
from ..model.builtin import is_builtin
from ..model.load import autocast_dtype, load_causal_lm, load_tokenizer, resolve_device
from ..plugins import import_object
from ..reward import verify
from ..reward.runner import RewardRunner
from ..rollout.backends import make_engine
from ..rollout.batch import concat_groups
from ..tracking.logger import NullLogger, StatsLogger, read_metrics
from ..tracking.plot import plot_run
from . import checkpoint as ckpt
from .collect import collect_groups
from .evaluate import evaluate
from .models import build_critic, build_ref
from .optim import build_optimizer, build_scheduler
from .sft import load_cached, sft_warmup, store_cached, warmstart_key
from .step import (
    batched_logprobs,
    batched_values,
    compute_advantage,
    critic_update,
    policy_update,
    rollout_metrics,
    training_batch,
)

DEFAULT_SFT_STEPS = 300
"""Warm-start steps for built-in (randomly initialised) models when ``sft_warmup.steps`` is null."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class RLTrainer:
    """Builds every component from the config once, then ``train()`` runs the steps."""

    def __init__(self, cfg: TrainerConfig, run_dir: str):
        self.cfg, self.run_dir = cfg, run_dir
        seed_everything(cfg.seed)
        self.dist, device = init_distributed(cfg.device)
        self.device = device or resolve_device(cfg.device)
        if cfg.train_dataset.batch_size % self.dist.world_size:
            raise UserError(f"train_dataset.batch_size={cfg.train_dataset.batch_size} (prompts per step, global) must be "
                            f"divisible by the {self.dist.world_size} processes.")
        if self.dist.fsdp and cfg.rollout.backend != "hf":
            raise UserError(f"rollout.backend={cfg.rollout.backend} is not supported with FSDP2 yet; use rollout.backend=hf.")
        self.autocast = autocast_dtype(cfg.actor.dtype, self.device)
        self.resume_from = self._resume_checkpoint()
        self.tokenizer = load_tokenizer(cfg.tokenizer_path or cfg.actor.path,
                                        key="tokenizer_path" if cfg.tokenizer_path else "actor.path")
        self.train_samples = build_samples(cfg.train_dataset, self.tokenizer, "train_dataset")
        self.valid_samples = (build_samples(cfg.valid_dataset, self.tokenizer, "valid_dataset")
                              if cfg.valid_dataset is not None else None)
        path = os.path.join(self.resume_from, "actor") if self.resume_from else cfg.actor.path
        self.model = load_causal_lm(path, tokenizer=self.tokenizer, dtype=cfg.actor.dtype, device=self.device,
                                    seed=cfg.seed, init_from_scratch=cfg.actor.init_from_scratch and not self.resume_from)
        if cfg.actor.gradient_checkpointing:
            getattr(self.model, "activation_checkpointing_enable", self.model.gradient_checkpointing_enable)()
        self.engine = make_engine(cfg, self.model, self.tokenizer, device=self.device, autocast_dtype=self.autocast)
        reward = RewardRunner(import_object(cfg.reward.fn, "reward.fn"), name=cfg.reward.fn, kwargs=cfg.reward.kwargs,
                              error_value=cfg.reward.error_value, max_error_fraction=cfg.reward.max_error_fraction)
        self.workflow = import_object(cfg.rollout.workflow, "rollout.workflow")(
            engine=self.engine, tokenizer=self.tokenizer, reward=reward, **cfg.rollout.workflow_kwargs)
        self.accept = import_object(cfg.rollout.dynamic_filter, "rollout.dynamic_filter") if cfg.rollout.dynamic_filter else None
        self.advantage_fn = resolve_advantage(cfg.actor)
        self.loss_fn = bind_policy_loss(cfg.actor)
        self.loader = PromptLoader(self.train_samples, cfg.train_dataset.batch_size, shuffle=cfg.train_dataset.shuffle,
                                   drop_last=cfg.train_dataset.drop_last, seed=cfg.seed, rank=self.dist.rank,
                                   world_size=self.dist.world_size)
        total = cfg.total_train_epochs * self.loader.steps_per_epoch
        self.total_steps = min(total, cfg.total_train_steps) if cfg.total_train_steps else total
        # Optimizers are built with the reference policy and critic, once the policy's parameters are
        # final (under FSDP2, the sharded ones); the warm start has its own optimizer.
        self.optimizer = self.scheduler = None
        self.ref = self.critic = self.critic_optimizer = self.critic_scheduler = None
        self.sum_fn = self.dist.sum_fn()
        self.sync_grads = self.dist.sync_gradients if self.dist.enabled and not self.dist.fsdp else None
        self.step, self.consecutive_skips = 0, 0
        self.last_save = self.last_eval = time.time()

    def _build_aux_models(self) -> None:
        """Reference policy and critic, from the policy as RL starts (or from the checkpoint); under
        FSDP2, the sharded policy and critic; then the optimizers and schedulers of both."""
        cfg = self.cfg
        self.ref = build_ref(cfg, self.model, self.tokenizer, self.device, self.resume_from)
        self.critic = build_critic(cfg, self.model, self.tokenizer, self.device, self.resume_from)
        if self.dist.fsdp:
            mesh = fsdp.device_mesh(self.device, self.dist.world_size)
            fsdp.shard_model(self.model, mesh)
            if self.critic is not None:
                fsdp.shard_model(self.critic, mesh)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.actor.optimizer)
        self.scheduler = build_scheduler(self.optimizer, cfg.actor.optimizer, self.total_steps)
        if self.critic is not None:
            self.critic_optimizer = build_optimizer(self.critic.parameters(), cfg.critic.optimizer)
            self.critic_scheduler = build_scheduler(self.critic_optimizer, cfg.critic.optimizer, self.total_steps)

    def _resume_checkpoint(self) -> str | None:
        found = ckpt.latest_checkpoint(self.run_dir)
        if self.cfg.recover.mode in ("auto", "on"):
            return found
        if found:
            raise UserError(f"{self.run_dir} already holds checkpoints of an earlier run ({found}). Resume it with "
                            "recover.mode=auto, or start a new run with another trial_name.")
        return None

    # -- state ------------------------------------------------------------------------------------
    def _restore(self) -> None:
        state = ckpt.load_trainer_state(self.resume_from)
        fsdp.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.loader.load_state_dict(state["loader"])
        self.step, self.consecutive_skips = state["step"], state["consecutive_skips"]
        self.engine.version = state["version"]
        if self.critic is not None:
            fsdp.load_optimizer_state(self.critic, self.critic_optimizer, state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        ckpt.set_rng_state(state["rng"][self.dist.rank] if isinstance(state["rng"], list) else state["rng"])

    def _save(self) -> str:
        state = {"optimizer": fsdp.optimizer_state(self.model, self.optimizer), "scheduler": self.scheduler.state_dict(),
                 "loader": self.loader.state_dict(), "consecutive_skips": self.consecutive_skips,
                 "version": self.engine.version}
        models = {"actor": self.model}
        if self.critic is not None:
            models["critic"] = self.critic
            state.update(critic_optimizer=fsdp.optimizer_state(self.critic, self.critic_optimizer),
                         critic_scheduler=self.critic_scheduler.state_dict())
        if self.ref is not None:
            models["ref"] = self.ref  # the policy as RL began; not reloadable from a path after a warm start
        self.last_save = time.time()
        rng = self.dist.gather_objects(ckpt.rng_state())
        weights = {k: fsdp.full_state_dict(m) for k, m in models.items() if fsdp.is_sharded(m)}  # collective
        if not self.dist.is_main:
            return ""
        return ckpt.save_checkpoint(self.run_dir, self.step, models=models, tokenizer=self.tokenizer,
                                    state={**state, "rng": rng}, keep_last=self.cfg.saver.keep_last, weights=weights)

    # -- schedule ---------------------------------------------------------------------------------
    def _due(self, freq, last: float) -> bool:
        epoch_end = self.step % self.loader.steps_per_epoch == 0
        due = bool((freq.freq_steps and self.step % freq.freq_steps == 0)
                   or (freq.freq_epochs and epoch_end and (self.step // self.loader.steps_per_epoch) % freq.freq_epochs == 0)
                   or (freq.freq_secs and time.time() - last >= freq.freq_secs))
        return self.dist.any(due)  # clocks differ between processes; decide together

    def _evaluate(self) -> dict[str, float]:
        if self.valid_samples is None:
            return {}
        t0 = time.time()
        mine = self.valid_samples[self.dist.rank::self.dist.world_size]
        with fsdp.gathered(self.model):
            out = evaluate(self.workflow, mine, self.cfg.eval_gconfig, self.cfg.valid_dataset.batch_size)
        self.last_eval = time.time()
        out["time/eval"] = self.last_eval - t0
        return self.dist.reduce_metrics(out)

    # -- the loop ---------------------------------------------------------------------------------
    def warm_start(self, log: StatsLogger) -> None:
        steps = self.cfg.sft_warmup.steps
        if steps is None:
            steps = DEFAULT_SFT_STEPS if is_builtin(self.cfg.actor.path) else 0
        if steps <= 0:
            return
        sft = self.cfg.sft_warmup
        key = None
        if sft.cache and is_builtin(self.cfg.actor.path):
            key = warmstart_key({"actor": self.cfg.actor.path, "seed": self.cfg.seed, "steps": steps, "sft": sft,
                                 "data": self.cfg.train_dataset, "device": self.device.type, "dtype": self.cfg.actor.dtype})
            cached = load_cached(self.model, key)
            if cached is not None:
                print(f"SFT warm start: reusing the identical earlier warm start {key} (sft_warmup.cache=false recomputes it)")
                log.log(0, {**cached, "sft/cached": 1.0})
                return
        t0 = time.time()
        losses = sft_warmup(self.model, self.tokenizer, self.train_samples, sft, steps=steps, seed=self.cfg.seed,
                            device=self.device, autocast_dtype=self.autocast, progress=self.cfg.stats_logger.progress_bar)
        metrics = {"sft/loss": losses[-1], "sft/steps": steps, "time/sft": time.time() - t0}
        if key is not None:
            store_cached(self.model, key, metrics)
        log.log(0, metrics)

    def train_step(self) -> dict[str, float]:
        cfg, a = self.cfg, self.cfg.actor
        t0 = time.time()
        world = self.dist.world_size
        with fsdp.gathered(self.model):
            groups, metrics = collect_groups(
                self.loader, self.workflow, cfg.gconfig, batch_size=cfg.train_dataset.batch_size // world,
                accept=self.accept, dynamic_bs=cfg.dynamic_bs, max_rounds=cfg.rollout.max_sampling_rounds,
                world_size=world, reduce_max=lambda x: int(self.dist.all_reduce(torch.tensor(x), "max")))
        if not groups:  # dynamic_bs and no prompt group passed the filter: nothing to train on
            return {**metrics, "reward/task": metrics["reward/sampled"], "update/skipped_empty_batch": 1.0,
                    "time/step": time.time() - t0}
        batch, sizes = concat_groups(groups)
        data = {k: v.to(self.device) for k, v in batch.items()}
        t1 = time.time()
        if a.should_compute_prox_logp():
            with fsdp.gathered(self.model):
                data["prox_logp"] = batched_logprobs(self.model, data, temperature=a.temperature,
                                                     mb_spec=a.mb_spec, autocast_dtype=self.autocast)
        if self.ref is not None:
            data["ref_logp"] = batched_logprobs(self.ref, data, temperature=a.temperature, mb_spec=a.mb_spec,
                                                autocast_dtype=self.autocast)
        if self.critic is not None:
            with fsdp.gathered(self.critic):
                data["values"] = batched_values(self.critic, data, mb_spec=cfg.critic.mb_spec,
                                                autocast_dtype=self.autocast)
        t2 = time.time()
        adv = compute_advantage(self.advantage_fn, data, a, sizes, all_reduce=self.sum_fn)
        # Every process must run the same number of optimizer steps.
        rows = int(self.dist.all_reduce(torch.tensor(len(data["rewards"])), "min"))
        t3 = time.time()
        upd, skipped = policy_update(self.model, self.optimizer, training_batch(data, adv), loss_fn=self.loss_fn,
                                     actor_cfg=a, version=self.engine.version, autocast_dtype=self.autocast,
                                     all_reduce=self.sum_fn, sync_grads=self.sync_grads,
                                     n_minibatches=min(a.ppo_n_minibatches, rows))
        self.scheduler.step()
        if self.critic is not None:
            cmetrics, _ = critic_update(self.critic, self.critic_optimizer, data, adv, critic_cfg=cfg.critic,
                                        autocast_dtype=self.autocast, all_reduce=self.sum_fn,
                                        sync_grads=self.sync_grads, n_minibatches=min(cfg.critic.ppo_n_minibatches, rows))
            self.critic_scheduler.step()
            metrics.update(cmetrics)
        self.engine.version += 1
        self.engine.update_weights(self.model)
        t4 = time.time()
        self.consecutive_skips = self.consecutive_skips + 1 if skipped == a.ppo_n_minibatches else 0
        tokens = float(data["attention_mask"].sum())
        metrics.update(rollout_metrics(data, adv))
        metrics.update(upd)
        metrics.update({"rollout/reward_errors": float(getattr(self.workflow, "reward_errors", 0)),
                        "reward/verify_timeouts": float(verify.timeouts()),
                        "time/rollout": t1 - t0, "time/logprobs": t2 - t1, "time/advantage": t3 - t2,
                        "time/update": t4 - t3, "time/step": t4 - t0, "perf/tokens_per_s": tokens / max(t4 - t0, 1e-9),
                        "lr": self.scheduler.get_last_lr()[0]})
        return metrics

    def train(self) -> dict[str, float]:
        if self.resume_from:
            self._build_aux_models()
            self._restore()
        main = self.dist.is_main
        log = StatsLogger(self.run_dir, self.cfg, resume_step=self.step if self.resume_from else None) if main else NullLogger()
        if not self.resume_from:
            self.warm_start(log)
            self.engine.update_weights(self.model)
            self._build_aux_models()
            if self.dist.enabled:  # identical initial weights everywhere; different samples per process
                seed_everything(self.cfg.seed + 10007 * self.dist.rank)
            if self.cfg.evaluator.eval_before_train:
                log.log(0, self._evaluate())
        bar = tqdm(total=self.total_steps, initial=self.step, desc=f"{self.cfg.algorithm}", dynamic_ncols=True,
                   disable=not (self.cfg.stats_logger.progress_bar and main))
        last: dict[str, float] = {}
        try:
            while self.step < self.total_steps:
                metrics = self.dist.reduce_metrics(self.train_step())
                self.step += 1
                if self.consecutive_skips >= self.cfg.actor.max_consecutive_nonfinite_steps:
                    found = ckpt.latest_checkpoint(self.run_dir)
                    raise UserError(f"{self.consecutive_skips} consecutive optimizer steps had a non-finite loss or "
                                    f"gradient norm; stopping at step {self.step}. Last checkpoint: {found}. Lower "
                                    "actor.optimizer.lr, check the reward scale, or raise actor.max_consecutive_nonfinite_steps.")
                final = self.step == self.total_steps
                if self._due(self.cfg.evaluator, self.last_eval) or final:
                    metrics.update(self._evaluate())
                # The record goes to disk before the checkpoint: a checkpoint then always implies its
                # step's record, and a kill between the two only repeats that step on resume.
                log.log(self.step, metrics)
                if self._due(self.cfg.saver, self.last_save) or self._due(self.cfg.recover, self.last_save):
                    self._save()
                last = metrics
                bar.set_postfix(reward=f"{metrics['reward/task']:.3f}",
                                **({"acc": f"{metrics['eval/accuracy']:.3f}"} if "eval/accuracy" in metrics else {}))
                bar.update(1)
        finally:
            bar.close()
            log.close()
        return self._summary(last) if main else {}

    def _summary(self, last: dict[str, float]) -> dict[str, float]:
        records = read_metrics(log_path := os.path.join(self.run_dir, "metrics.jsonl"))
        acc = [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
        if self.cfg.stats_logger.plot and records:
            plot_run(self.run_dir, title=f"{self.cfg.algorithm} / {self.cfg.experiment_name} / {self.cfg.trial_name}")
        summary = {"final_step": self.step, **{k: v for k, v in last.items() if k.startswith(("eval/", "reward/"))}}
        if acc:
            before, after = acc[0][1], acc[-1][1]
            summary.update({"accuracy_before": before, "accuracy_after": after})
            print(f"held-out accuracy: {100 * before:.1f}% at step {acc[0][0]} (before RL) -> {100 * after:.1f}% at "
                  f"step {acc[-1][0]} ({100 * (after - before):+.1f} points)")
        print(f"run directory: {self.run_dir} (metrics: {log_path})")
        return summary


def run(cfg: TrainerConfig, run_dir: str) -> dict[str, float]:
    """Train according to ``cfg``, writing everything into ``run_dir``; returns a summary."""
    trainer = RLTrainer(cfg, run_dir)
    try:
        return trainer.train()
    finally:
        trainer.dist.shutdown()
