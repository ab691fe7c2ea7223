"""The training loop. Each step: rollout (generate + reward) -> extra forwards -> advantage ->
policy update -> evaluation / checkpoint -> metrics. ``run(cfg, run_dir)`` is the whole job.

The trainer owns the policy version: it is the step count (the number of optimizer updates the
weights have seen), and it advances together with the LR schedule exactly once per step, also for a
step with nothing to train on; the rollout receives the new weights with their version after every
step (``sources.py``). Which log-probabilities the three policies get is decided in ``policies.py``.

Under FSDP2 (``fsdp.py``) the policy and critic are sharded once the reference policy and critic
have been copied from the whole policy (``_build_aux_models``); generation and the no-grad
forwards run with the weights gathered (``fsdp.gathered``), checkpoints hold the full weights.

With ``actor.use_lora`` (``model/lora.py``) the warm start trains the whole base model; the adapters
are attached in place when RL begins (``_attach_lora``), after the critic is copied; engines with
their own weights then receive the merged weights (``_push_weights``). ``critic.use_lora`` gives the
critic its own adapters when it is built (``models.build_critic``). Under FSDP2 the adapters are
attached before the models are sharded, and checkpoints and merged weights come from the gathered
full state dicts.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import fsdp
from ..advantage.stages import resolve_advantage
from ..config.loss import bind_policy_loss
from ..config.schema import TrainerConfig
from ..data.datasets import build_samples, check_fits_batch
from ..data.loader import PromptLoader
from ..dist import init_distributed
from ..errors import UserError
from ..model import lora
from ..model.load import autocast_dtype, load_causal_lm, load_tokenizer, resolve_device
from ..model.prefix import group_prefix, resolve_tree_training
from ..plugins import import_object
from ..reward.runner import RewardRunner
from ..rollout.batch import concat_groups
from ..tracking import runlog
from ..tracking.console import ProgressPostfix
from ..tracking.logger import NullLogger, StatsLogger, read_metrics
from ..tracking.plot import plot_run
from ..tracking.samples import eval_example, step_samples
from . import checkpoint as ckpt
from . import policies
from .evaluate import evaluate
from .models import build_critic, build_ref, check_critic_lora, ref_is_base
from .optim import build_optimizer, build_scheduler
from .sft import warm_start
from .sources import build_rollout, rollout_mode
from .step import (
    batched_logprobs,
    batched_values,
    compute_advantage,
    critic_update,
    policy_update,
    rollout_metrics,
    training_batch,
)


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
        check_fits_batch(self.train_samples, cfg.train_dataset, "train_dataset", self.dist.world_size)
        self.valid_samples = (build_samples(cfg.valid_dataset, self.tokenizer, "valid_dataset")
                              if cfg.valid_dataset is not None else None)
        actor_dir = os.path.join(self.resume_from, "actor") if self.resume_from else None
        self.adapter_dir = lora.resume_adapter_dir(self.resume_from, "actor", cfg.actor.use_lora)
        if cfg.critic is not None:  # a mismatch fails now, not once the critic is built
            lora.resume_adapter_dir(self.resume_from, "critic", cfg.critic.use_lora)
        path = actor_dir if actor_dir and not self.adapter_dir else cfg.actor.path
        self.model = load_causal_lm(path, tokenizer=self.tokenizer, dtype=cfg.actor.dtype, device=self.device,
                                    seed=cfg.seed, init_from_scratch=cfg.actor.init_from_scratch and path == cfg.actor.path)
        self.peft = None  # the PeftModel around self.model once LoRA adapters are attached
        # Whether the base weights differ from what actor.path loads (a warm start, init_from_scratch): then
        # LoRA checkpoints carry them, also those of a LoRA critic copied from the policy.
        self.lora_base_changed = cfg.actor.init_from_scratch
        if self.adapter_dir:
            self.lora_base_changed = lora.load_base_weights(self.model, self.adapter_dir, cfg.actor.path)
        elif cfg.actor.use_lora:
            lora.lora_config(cfg.actor, self.model)  # bad target modules fail now, not after the warm start
        for section, name in ((cfg.actor, "actor"), (cfg.critic, "critic")):  # likewise an impossible =true
            if section is not None and section.enable_tree_training and section.path == cfg.actor.path:
                resolve_tree_training(self.model.base_model, True, f"{name}.enable_tree_training")
        if not self.resume_from:
            check_critic_lora(cfg, self.model, self.tokenizer)
        if cfg.actor.gradient_checkpointing:
            getattr(self.model, "activation_checkpointing_enable", self.model.gradient_checkpointing_enable)()
        reward = RewardRunner(import_object(cfg.reward.fn, "reward.fn"), name=cfg.reward.fn, kwargs=cfg.reward.kwargs,
                              error_value=cfg.reward.error_value, max_error_fraction=cfg.reward.max_error_fraction)
        self.mode = rollout_mode(cfg)
        self.loader = PromptLoader(self.train_samples, cfg.train_dataset.batch_size, shuffle=cfg.train_dataset.shuffle,
                                   drop_last=cfg.train_dataset.drop_last, seed=cfg.seed, rank=self.dist.rank,
                                   world_size=self.dist.world_size,
                                   mode="local" if self.mode == "concurrent" else "global")
        rollout = build_rollout(cfg, model=self.model, tokenizer=self.tokenizer, reward=reward, loader=self.loader,
                                device=self.device, autocast_dtype=self.autocast, world_size=self.dist.world_size,
                                reduce_max=lambda x: int(self.dist.all_reduce(torch.tensor(x), "max")))
        self.source, self.engine, self.eval_workflow = rollout.source, rollout.engine, rollout.eval_workflow
        self.colocated = self.mode == "sync" and cfg.rollout.dtype is None  # generation runs on self.model
        self.plan = policies.PolicyPlan.from_actor(cfg.actor)
        self.advantage_fn = resolve_advantage(cfg.actor)
        self.loss_fn = bind_policy_loss(cfg.actor)
        total = cfg.total_train_epochs * self.loader.steps_per_epoch
        self.total_steps = min(total, cfg.total_train_steps) if cfg.total_train_steps else total
        # Optimizers are built with the reference policy and critic, once the policy's parameters are
        # final (under FSDP2, the sharded ones); the warm start has its own optimizer.
        self.optimizer = self.scheduler = None
        self.ref = self.critic = self.critic_optimizer = self.critic_scheduler = None
        self.share_actor = self.share_ref = self.share_critic = False  # set with the models (_resolve_tree_training)
        self.critic_saved = None  # what a checkpoint's critic/ saves: the critic, or its LoRA adapter and head
        self.sum_fn = self.dist.sum_fn()
        self.sync_grads = self.dist.sync_gradients if self.dist.enabled and not self.dist.fsdp else None
        self.step, self.consecutive_skips = 0, 0
        self.trained_prompts: list[int] = []
        self.samples: list[dict] = []  # the step's records for samples.jsonl (main process only)
        self.last_save = self.last_eval = time.time()

    @property
    def version(self) -> int:
        """The policy version of the current weights: the number of steps taken."""
        return self.step

    def _build_aux_models(self) -> None:
        """Reference policy and critic, from the policy as RL starts (or from the checkpoint); under
        FSDP2, the sharded policy and critic; then the optimizers and schedulers of both."""
        cfg = self.cfg
        self.ref = build_ref(cfg, self.model, self.tokenizer, self.device, self.resume_from)
        self.critic, self.critic_saved = build_critic(cfg, self.model, self.tokenizer, self.device, self.resume_from,
                                                      policy_changed=self.lora_base_changed)
        if self.critic_saved is not self.critic and self.dist.is_main:
            print(f"critic {lora.summary(self.critic)}", flush=True)
        if cfg.actor.use_lora:
            self._attach_lora()
        self._resolve_tree_training()
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

    def _resolve_tree_training(self) -> None:
        """Which models compute shared prompt prefixes once (``*.enable_tree_training``; probed on the
        unsharded models)."""
        cfg, lines = self.cfg, []

        def resolve(backbone, requested, key) -> bool:
            on, line = resolve_tree_training(backbone, requested, key)
            lines.append(line)
            return on

        self.share_actor = resolve(self.model.base_model, cfg.actor.enable_tree_training, "actor.enable_tree_training")
        self.share_ref = self.share_actor if self.ref is None else resolve(
            self.ref.base_model, cfg.actor.enable_tree_training, "actor.enable_tree_training")
        self.share_critic = self.critic is not None and resolve(
            self.critic.backbone, cfg.critic.enable_tree_training, "critic.enable_tree_training")
        for line in dict.fromkeys(line for line in lines if line):
            if self.dist.is_main:
                print(line, flush=True)

    def _attach_lora(self) -> None:
        """LoRA adapters in place on the policy: new ones, or the checkpoint's when resuming."""
        a = self.cfg.actor
        self.peft = lora.attach(self.model, a, seed=self.cfg.seed, adapter_dir=self.adapter_dir)
        if a.gradient_checkpointing:  # frozen embeddings: checkpointed blocks still need an input with grad
            self.model.enable_input_require_grads()
        if self.dist.is_main:
            print(lora.summary(self.peft), flush=True)

    @contextlib.contextmanager
    def _reference(self):
        """The reference policy for the KL term: its own model, or the LoRA policy with the adapter off
        (gathered under FSDP2, like every no-grad forward of the policy)."""
        if self.peft is None or self.ref is not None:
            yield self.ref
            return
        with fsdp.gathered(self.model), lora.reference_policy(self.peft) as ref:
            yield ref

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
        self.step, self.consecutive_skips = state["step"], state["consecutive_skips"]
        try:
            source = state["source"] if "source" in state else {"loader": state["loader"]}  # older checkpoints
            self.source.load_state_dict(source, self.version)
        except (ValueError, KeyError) as e:
            raise UserError(f"{self.resume_from} was written by a run with other rollout settings ({e}); resume it "
                            "with the rollout.max_head_offpolicyness and rollout.offpolicy_mode it was started with.") from None
        if self.critic is not None:
            fsdp.load_optimizer_state(self.critic, self.critic_optimizer, state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        ckpt.set_rng_state(state["rng"][self.dist.rank] if isinstance(state["rng"], list) else state["rng"])

    def _save(self) -> str:
        state = {"optimizer": fsdp.optimizer_state(self.model, self.optimizer), "scheduler": self.scheduler.state_dict(),
                 "source": self.source.state_dict(), "consecutive_skips": self.consecutive_skips,
                 "version": self.version}
        models = {"actor": self.model if self.peft is None else
                  lora.AdapterCheckpoint(self.peft, self.cfg.actor.path, self.lora_base_changed)}
        if self.critic is not None:
            models["critic"] = self.critic_saved
            state.update(critic_optimizer=fsdp.optimizer_state(self.critic, self.critic_optimizer),
                         critic_scheduler=self.critic_scheduler.state_dict())
        if self.ref is not None:
            models["ref"] = self.ref  # the policy as RL began; not reloadable from a path after a warm start
        self.last_save = time.time()
        rng = self.dist.gather_objects(ckpt.rng_state())
        # Sharded models (a LoRA checkpoint's: its ``module``) are saved from their full weights (collective).
        sharded = {k: getattr(m, "module", m) for k, m in models.items()}
        weights = {k: fsdp.full_state_dict(m) for k, m in sharded.items() if fsdp.is_sharded(m)}
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
        examples: list = []
        with fsdp.gathered(self.model):
            out = evaluate(self.eval_workflow, mine, self.cfg.eval_gconfig, self.cfg.valid_dataset.batch_size,
                           examples=examples)
        if self.dist.is_main and examples:  # tqdm.write keeps a running progress bar intact
            tqdm.write(eval_example(self.tokenizer, examples[0], self.step))
        self.last_eval = time.time()
        out["time/eval"] = self.last_eval - t0
        return self.dist.reduce_metrics(out)

    # -- the loop ---------------------------------------------------------------------------------
    def warm_start(self, log: StatsLogger) -> None:
        metrics = warm_start(self.model, self.tokenizer, self.train_samples, self.cfg, device=self.device,
                             autocast_dtype=self.autocast)
        self.lora_base_changed |= bool(metrics)  # a warm start trained the base
        if metrics:
            log.log(0, metrics)

    def _push_weights(self) -> None:
        """Hand the current weights, with their version, to the rollout."""
        weights = self.model
        if fsdp.is_sharded(self.model) and not self.colocated:
            weights = fsdp.full_state_dict(self.model, all_ranks=True)  # collective
        if self.peft is not None and not (self.colocated and self.cfg.rollout.backend == "hf"):
            full = weights if isinstance(weights, dict) else None  # gathered from the shards
            weights = lora.merged_state_dict(self.peft, state=full)  # an engine with its own, plain weights
        self.source.update_weights(weights, self.version)

    def _advance(self) -> None:
        """End a step: the LR schedules, the step count and the policy version advance together, and
        the rollout receives the new weights (also after a step with nothing to train on)."""
        self.scheduler.step()
        if self.critic is not None:
            self.critic_scheduler.step()
        self.step += 1
        self._push_weights()

    def _generation(self):
        """Where the trained model generates: gathered under FSDP2 when the rollout runs on it."""
        return fsdp.gathered(self.model) if self.colocated else contextlib.nullcontext()

    def train_step(self) -> dict[str, float]:
        cfg, a = self.cfg, self.cfg.actor
        t0 = time.time()
        with self._generation():
            batch = self.source.next_batch(self.version)
        metrics = batch.metrics
        self.trained_prompts = batch.prompt_ids
        self.samples = []
        # dynamic_bs and no prompt group passed the filter: nothing to train on. Every process skips the
        # step together (with asynchronous rollout each one's batch is its own).
        if self.dist.any(not batch.groups):
            self.trained_prompts = []
            self._advance()
            return {**metrics, "reward/task": metrics["reward/sampled"], "update/skipped_empty_batch": 1.0,
                    "lr": self.scheduler.get_last_lr()[0], "time/step": time.time() - t0}
        tensors, sizes = concat_groups(batch.groups)
        data = {k: v.to(self.device) for k, v in tensors.items()}
        t1 = time.time()
        # Shared-prefix training: the prompt groups, kept together by every micro-batch split.
        groups = group_prefix(data["input_ids"], data["attention_mask"], sizes) \
            if self.share_actor or self.share_ref or self.share_critic else None

        def recompute(d: dict) -> torch.Tensor:
            with fsdp.gathered(self.model):
                return batched_logprobs(self.model, d, temperature=a.temperature, mb_spec=a.mb_spec,
                                        autocast_dtype=self.autocast, prefix=groups if self.share_actor else None)

        logps = policies.prepare(self.plan, data, recompute)
        if self.ref is not None or ref_is_base(cfg):
            with self._reference() as ref:
                data["ref_logp"] = batched_logprobs(ref, data, temperature=a.temperature, mb_spec=a.mb_spec,
                                                    autocast_dtype=self.autocast,
                                                    prefix=groups if self.share_ref else None)
        if self.critic is not None:
            with fsdp.gathered(self.critic):
                data["values"] = batched_values(self.critic, data, mb_spec=cfg.critic.mb_spec,
                                                autocast_dtype=self.autocast,
                                                prefix=groups if self.share_critic else None)
        t2 = time.time()
        adv = compute_advantage(self.advantage_fn, data, a, sizes, all_reduce=self.sum_fn, old_logprobs=logps.old)
        # Every process must run the same number of optimizer steps.
        rows = int(self.dist.all_reduce(torch.tensor(len(data["rewards"])), "min"))
        t3 = time.time()
        pols = policies.for_loss(self.plan, logps, adv, self.version)
        upd, skipped = policy_update(self.model, self.optimizer, training_batch(data, adv, pols), loss_fn=self.loss_fn,
                                     actor_cfg=a, version=self.version, autocast_dtype=self.autocast,
                                     all_reduce=self.sum_fn, sync_grads=self.sync_grads,
                                     n_minibatches=min(a.ppo_n_minibatches, rows),
                                     prefix=groups if self.share_actor else None)
        if self.critic is not None:
            cmetrics, _ = critic_update(self.critic, self.critic_optimizer, data, adv, critic_cfg=cfg.critic,
                                        autocast_dtype=self.autocast, all_reduce=self.sum_fn,
                                        sync_grads=self.sync_grads, n_minibatches=min(cfg.critic.ppo_n_minibatches, rows),
                                        prefix=groups if self.share_critic else None)
            metrics.update(cmetrics)
        metrics.update(policies.policy_metrics(logps, adv.loss_mask, self.version,
                                               cfg.rollout.max_head_offpolicyness))
        self._advance()
        t4 = time.time()
        self.consecutive_skips = self.consecutive_skips + 1 if skipped == a.ppo_n_minibatches else 0
        tokens = float(data["attention_mask"].sum())
        metrics.update(rollout_metrics(data, adv))
        if self.dist.is_main:  # only the main process writes samples.jsonl
            self.samples = step_samples(self.tokenizer, data, adv.advantages, adv.loss_mask, sizes,
                                        cfg.stats_logger.samples_per_step, [g.prompt_id for g in batch.groups])
        metrics.update(upd)
        metrics.update({"time/rollout": t1 - t0, "time/logprobs": t2 - t1, "time/advantage": t3 - t2,
                        "time/update": t4 - t3, "time/step": t4 - t0, "perf/tokens_per_s": tokens / max(t4 - t0, 1e-9),
                        "lr": self.scheduler.get_last_lr()[0]})
        return metrics

    def train(self) -> dict[str, float]:
        if self.resume_from:
            self._build_aux_models()
            self._restore()
            self._push_weights()
            if self.dist.is_main:  # say where the run continues from before its first step
                print(f"resuming from {self.resume_from} (step {self.step} of {self.total_steps})", flush=True)
        main = self.dist.is_main
        log = StatsLogger(self.run_dir, self.cfg, resume_step=self.step if self.resume_from else None) if main else NullLogger()
        # On resume the bar starts from the latest accuracy in the metrics file (truncated to the checkpoint).
        metrics_file = os.path.join(self.run_dir, "metrics.jsonl")
        resumed = self.resume_from and main and os.path.exists(metrics_file)
        postfix = ProgressPostfix(read_metrics(metrics_file) if resumed else None)
        if not self.resume_from:
            self.warm_start(log)
            self._push_weights()
            self._build_aux_models()
            if self.dist.enabled:  # identical initial weights everywhere; different samples per process
                seed_everything(self.cfg.seed + 10007 * self.dist.rank)
            if self.cfg.evaluator.eval_before_train:
                before = self._evaluate()
                postfix.update(before)
                log.log(0, before)
        bar = tqdm(total=self.total_steps, initial=self.step, desc=f"{self.cfg.algorithm}", dynamic_ncols=True,
                   disable=not (self.cfg.stats_logger.progress_bar and main))
        last: dict[str, float] = {}
        self.source.start()
        try:
            while self.step < self.total_steps:
                metrics = self.dist.reduce_metrics(self.train_step())
                prompts = sorted(i for ids in self.dist.gather_objects(self.trained_prompts) for i in ids)
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
                log.log(self.step, metrics, extra={"data/prompt_ids": prompts})
                log.log_samples(self.step, self.samples)
                if self._due(self.cfg.saver, self.last_save) or self._due(self.cfg.recover, self.last_save):
                    self._save()
                last = metrics
                shown = postfix(metrics)
                bar.set_postfix(shown)  # a dict, so the reward stays first
                bar.update(1)
                runlog.note(f"{self.cfg.algorithm} step {self.step}/{self.total_steps}: "
                            + ", ".join(f"{k} {v}" for k, v in shown.items()))  # the bar's state, once per step
        finally:
            self.source.close()
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


class Terminated(SystemExit):
    """SIGTERM arrived: the run stops like after Ctrl-C (exit status 143)."""


@contextlib.contextmanager
def _sigterm_stops_cleanly():
    """SIGTERM raises :class:`Terminated` in the main thread, so the rollout thread is stopped and the
    files are closed on the way out (the newest complete checkpoint stays valid: checkpoints are
    renamed into place only once complete)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(cfg: TrainerConfig, run_dir: str) -> dict[str, float]:
    """Train according to ``cfg``, writing everything into ``run_dir``; returns a summary."""
    with _sigterm_stops_cleanly():
        trainer = RLTrainer(cfg, run_dir)
        try:
            return trainer.train()
        finally:
            trainer.dist.shutdown()
