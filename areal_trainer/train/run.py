"""A run's state: everything built from the components once (``Trainer``); the loop that drives it, and
the whole job (``run(components, run_dir)``), live in ``loop.py``.

The trainer owns the policy version: it is the step count (the number of optimizer updates the
weights have seen), and it advances together with the LR schedule exactly once per step, also for a
step with nothing to train on; the rollout receives the new weights with their version after every
step (``advance``). Which log-probabilities the three policies get is decided in ``policies.py``.

Before any weights load, the built samples are checked against the rest of the run (``preflight.py``: the
reward functions' columns, what the warm start can imitate, the run's length, the tokenizer's unknown
words). Models are built in an order the features need: the policy is loaded (``PolicyModel.load``); the
supervised warm start trains its whole base; then the reference policy and critic are copied from it
(``models/build.py``); then the policy's LoRA adapters are attached, shared-prefix training resolved and,
under FSDP2 (``parallel.fsdp``), the policy and critic sharded; then the optimizers are built; then the
teachers of on-policy distillation are loaded (``models/teacher.py``; their tokenizers and routes were checked
before the policy's weights loaded).
"""

from __future__ import annotations

import random
import time

import numpy as np
import torch

from .. import fsdp
from ..components import Components
from ..data.datasets import build_samples, check_fits_batch
from ..data.loader import PromptLoader
from ..dist import init_distributed
from ..errors import UserError
from ..metrics import Mean, Metric, Sum, floats
from ..model.limits import RowLimit
from ..model.load import load_positions, load_processor, load_tokenizer, resolve_device
from ..model.prefix import resolve_tree_training
from ..model.vision import VisionEncoder
from .models.build import build_critic, build_ref, check_critic_lora, ref_is_base
from .models.critic import CriticModel
from .models.policy import PolicyModel, ReferenceModel
from .models.teacher import NoReward, Teachers, check_teachers
from .perf import ModelShape, peak_tflops, step_perf
from .preflight import preflight
from .sft import warm_start
from .sources.build import build_rollout, rollout_mode
from .state import checkpoint as ckpt
from .state.resume import settings_of
from .step import StepContext, StepResult, train_step


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _first_image_row(*sample_sets: list[dict] | None) -> dict | None:
    return next((s for samples in sample_sets for s in samples or () if s.get("vision") is not None
                 and s["vision"].refs), None)


def any_images(*sample_sets: list[dict] | None) -> bool:
    return _first_image_row(*sample_sets) is not None


def check_image_support(components: Components, *sample_sets: list[dict] | None) -> None:
    """Image prompts need a rollout backend that samples with images (``EngineSpec.takes_images``) and no feature
    that cannot show the images to its model yet; checked before any weights load (the teachers' part by
    ``check_teachers``)."""
    cfg = components.config
    first = _first_image_row(*sample_sets)
    if first is None:
        return
    where = f"{first['row']} has images"
    if not components.rollout.engine.takes_images:
        raise UserError(f"rollout.backend={cfg.rollout.backend!r}: {where}, and this backend samples text prompts "
                        "only. Use rollout.backend=hf for image prompts (docs/vlm.md).")
    if not getattr(components.rollout.workflow, "takes_images", False):
        raise UserError(f"rollout.workflow={cfg.rollout.workflow!r}: this workflow samples text prompts only, and "
                        f"{where}. Use the single-turn workflow or an agent (rollout.agent) for image prompts (a "
                        "workflow class that handles images sets takes_images = True; docs/vlm.md).")


class Trainer:
    """The run's components, built once: data, tokenizer, policy, rollout; after the warm start (or on
    resume) the reference policy, the critic and the optimizers (:meth:`prepare_models`)."""

    def __init__(self, components: Components, run_dir: str, resume_from: str | None = None):
        cfg = self.cfg = components.config
        self.components, self.run_dir = components, run_dir
        seed_everything(cfg.seed)
        self.dist, device = init_distributed(cfg.device, fsdp=cfg.parallel.fsdp)
        self.device = device or resolve_device(cfg.device)
        if cfg.train_dataset.batch_size % self.dist.world_size:
            raise UserError(f"train_dataset.batch_size={cfg.train_dataset.batch_size} (prompts per step, global) "
                            f"must be divisible by the {self.dist.world_size} processes.")
        self.resume_from = resume_from
        self.resumed_step = 0
        self.start_norm: float | None = None
        """The actor's weight norm when training began (kept across resumes): what checkpoints are judged by."""
        """The step the run resumed at (0 for a fresh start): the loop's stop message judges the steps since."""
        self.tokenizer = load_tokenizer(cfg.tokenizer_path or cfg.actor.path,
                                        key="tokenizer_path" if cfg.tokenizer_path else "actor.path")
        positions = load_positions(cfg.actor.path, tokenizer=self.tokenizer)  # from the config: no weights yet
        self.processor = load_processor(cfg.actor.path, tokenizer=self.tokenizer)  # None for a text-only model
        vision = None if self.processor is None else VisionEncoder(self.processor, self.tokenizer)
        self.image_token = None if vision is None else self.tokenizer.convert_ids_to_tokens(vision.image_token_id)
        env = components.environment  # an environment gives the rows (environment.type)
        self.train_samples = build_samples(cfg.train_dataset, self.tokenizer, "train_dataset",
                                           RowLimit.of(cfg.gconfig, "gconfig", positions), vision, cfg.actor.path,
                                           rows=None if env is None else env.rows("train"))
        check_fits_batch(self.train_samples, cfg.train_dataset, "train_dataset", self.dist.world_size)
        valid = components.valid_dataset
        self.valid_samples = None if valid is None else build_samples(
            valid, self.tokenizer, "valid_dataset", RowLimit.of(cfg.eval_gconfig, "eval_gconfig", positions), vision,
            cfg.actor.path, rows=None if env is None else env.rows("eval"))
        check_image_support(components, self.train_samples, self.valid_samples)
        distill = components.distill
        if distill is not None:  # the teachers' vocabularies and routes, before any weights load
            check_teachers(distill, self.tokenizer,
                           student_key="tokenizer_path" if cfg.tokenizer_path else "actor.path",
                           student_path=cfg.tokenizer_path or cfg.actor.path, samples=self.train_samples,
                           processor=self.processor, images=any_images(self.train_samples, self.valid_samples))
        self.preflight = preflight(components, self.tokenizer, self.train_samples, self.valid_samples,
                                   resuming=bool(resume_from), main=self.dist.is_main)  # before any weights load
        self.policy = PolicyModel.load(cfg.actor, tokenizer=self.tokenizer, device=self.device, dist=self.dist,
                                       seed=cfg.seed, resume_from=self.resume_from)
        self._check_critic()
        self.reward = components.reward.start(device=self.device)  # worker pools, a reward model: closed by run()
        self.loader = PromptLoader(self.train_samples, cfg.train_dataset.batch_size, shuffle=cfg.train_dataset.shuffle,
                                   drop_last=cfg.train_dataset.drop_last, seed=cfg.seed, rank=self.dist.rank,
                                   world_size=self.dist.world_size,
                                   mode="local" if rollout_mode(cfg) == "concurrent" else "global")
        # Pure distillation scores no training answer (AReaL): its rollouts get no reward function at all.
        train_reward = NoReward() if distill is not None and distill.pure else self.reward
        rollout = build_rollout(cfg, components.rollout, model=self.policy.model, tokenizer=self.tokenizer,
                                reward=train_reward, eval_reward=self.reward, loader=self.loader, device=self.device,
                                autocast_dtype=self.policy.autocast, world_size=self.dist.world_size,
                                reduce_max=lambda x: int(self.dist.all_reduce(torch.tensor(x), "max")),
                                work_dir=run_dir, dist=self.dist, processor=self.processor)
        self.rollout = rollout
        self.source, self.eval_workflow = rollout.source, rollout.eval_workflow
        self.policy.colocated = rollout.colocated
        self.engine_samples_model = not components.rollout.engine.holds_own_weights
        self.total_steps = self.preflight.total_steps
        self.shape = ModelShape.of(self.policy.model)
        self.peak_tflops = peak_tflops(torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None)
        self.reference: ReferenceModel | None = None
        self.critic: CriticModel | None = None
        self.teachers: Teachers | None = None
        self.step, self.consecutive_skips = 0, 0

    @property
    def version(self) -> int:
        """The policy version of the current weights: the number of steps taken."""
        return self.step

    def _check_critic(self) -> None:
        """Critic settings that cannot work fail at start-up, not once the critic is built after the warm start."""
        cfg = self.cfg
        if cfg.critic is None:
            return
        from ..model import lora

        lora.resume_adapter_dir(self.resume_from, "critic", cfg.critic.use_lora)  # a mismatch with the checkpoint
        if cfg.critic.enable_tree_training and cfg.critic.path == cfg.actor.path:
            resolve_tree_training(self.policy.model.base_model, True, "critic.enable_tree_training")
        if not self.resume_from:
            check_critic_lora(cfg, self.policy.model, self.tokenizer)

    # -- models -----------------------------------------------------------------------------------------
    def warm_start(self) -> dict[str, float]:
        metrics = warm_start(self.policy.model, self.tokenizer, self.train_samples, self.cfg, device=self.device,
                             autocast_dtype=self.policy.autocast, plan=self.preflight.warm)
        self.policy.base_changed |= bool(metrics)  # a warm start trained the base
        return metrics

    def prepare_models(self) -> None:
        """Reference policy and critic from the policy as RL starts (or from the checkpoint), then the
        policy's adapters, sharing and sharding, and every optimizer (see the module docstring)."""
        cfg, main = self.cfg, self.dist.is_main
        ref = build_ref(cfg, self.policy.model, self.tokenizer, self.device, self.resume_from)
        critic, saved = build_critic(cfg, self.policy.model, self.tokenizer, self.device, self.resume_from,
                                     policy_changed=self.policy.base_changed)
        mesh = fsdp.device_mesh(self.device, self.dist.world_size) if self.dist.fsdp else None
        lines = []
        if critic is not None:
            self.critic = CriticModel(critic, saved, cfg.critic, autocast=self.policy.autocast)
            if saved is not critic:
                from ..model import lora

                lines.append(f"critic {lora.summary(critic)}")
        lines += self.policy.prepare(seed=cfg.seed, total_steps=self.total_steps, mesh=mesh)
        if ref is not None or ref_is_base(cfg):
            self.reference = ReferenceModel(ref, self.policy)
            lines += [self.reference.line] if self.reference.line else []
        if self.critic is not None:
            lines += self.critic.prepare(total_steps=self.total_steps, mesh=mesh)
        if self.components.distill is not None:  # frozen and never saved: a resume loads them from their paths
            self.teachers = Teachers.load(self.components.distill, tokenizer=self.tokenizer, device=self.device,
                                          seed=cfg.seed, samples=self.train_samples, mesh=mesh)
            lines += self.teachers.lines
        for line in lines:
            if main:
                print(line, flush=True)

    def step_context(self) -> StepContext:
        a, c = self.cfg.actor, self.cfg.critic
        return StepContext(policy=self.policy, reference=self.reference, critic=self.critic, source=self.source,
                           advantage=self.components.advantage, loss=self.components.loss, plan=self.components.plan,
                           dist=self.dist, device=self.device, actor_config=a, n_minibatches=a.ppo_n_minibatches,
                           critic_minibatches=c.ppo_n_minibatches if c is not None else 0,
                           max_staleness=self.cfg.rollout.max_head_offpolicyness, teachers=self.teachers,
                           distill=self.components.distill)

    def step_once(self, ctx: StepContext) -> tuple[StepResult, dict[str, float]]:
        """One training step, then the version advances: the step's result and its metrics over every
        process (with the learning rate, the step's time and throughput)."""
        t0 = time.time()
        result = train_step(ctx, self.version)
        t_push = time.time()
        self.advance()
        self.consecutive_skips = self.consecutive_skips + 1 if result.all_skipped else 0
        took = time.time() - t0
        result.metrics.update({"lr": Mean(self.policy.scheduler.get_last_lr()[0]), "time/step": Mean(took),
                               "time/weight_push": Mean(time.time() - t_push),
                               "perf/tokens_per_s": Sum(result.tokens / max(took, 1e-9))})
        result.metrics.update(self.perf_metrics(result))
        return result, floats(self.dist.reduce_metrics(result.metrics))

    def perf_metrics(self, result: StepResult) -> dict[str, Metric]:
        """``perf/*`` of the step (``perf.py``), and what the rollout engine reports of itself (inference servers:
        their requests, retries, failures and the weight update's seconds)."""
        out: dict[str, Metric] = {}
        if result.batch is not None:
            b = result.batch
            times = {k: float(v.value) for k, v in result.metrics.items() if k.startswith("time/")}
            extra = int(self.components.plan.recompute) + int(self.reference is not None)
            perf = step_perf(self.shape, tokens=result.tokens, rows=b.n_rows, sampled=float(b.loss_mask.sum()),
                             times=times, extra_forwards=extra, peak=self.peak_tflops)
            out.update({k: Mean(v) for k, v in perf.items()})
        telemetry = getattr(self.rollout.engine, "telemetry", None)
        if callable(telemetry):
            out.update({k: (Mean(v) if k.startswith("perf/") else Sum(v)) for k, v in telemetry().items()})
        return out

    # -- the policy version -----------------------------------------------------------------------------
    def push_weights(self) -> None:
        """Hand the current weights, with their version, to the rollout."""
        weights = self.policy.rollout_weights(on_policy_object=self.policy.colocated,
                                              engine_samples_model=self.engine_samples_model,
                                              stream=getattr(self.rollout.engine, "takes_weight_stream", False))
        self.source.update_weights(weights, self.version)

    def advance(self) -> None:
        """End a step: the LR schedules, the step count and the policy version advance together, and the
        rollout receives the new weights (also after a step with nothing to train on)."""
        self.policy.scheduler.step()
        if self.critic is not None:
            self.critic.scheduler.step()
        self.step += 1
        self.push_weights()

    # -- checkpoints -----------------------------------------------------------------------------------
    def restore(self) -> None:
        state = ckpt.load_trainer_state(self.resume_from)
        self.policy.load_state_dict(state)
        self.step, self.consecutive_skips = state["step"], state["consecutive_skips"]
        try:
            source = state["source"] if "source" in state else {"loader": state["loader"]}  # older checkpoints
            self.source.load_state_dict(source, self.version)
        except (ValueError, KeyError) as e:
            raise UserError(f"{self.resume_from} was written by a run with other rollout settings ({e}); resume it "
                            "with the rollout.max_head_offpolicyness and rollout.offpolicy_mode it was started "
                            "with.") from None
        if self.critic is not None:
            self.critic.load_state_dict(state)
        ckpt.set_rng_state(state["rng"][self.dist.rank] if isinstance(state["rng"], list) else state["rng"])

    def save(self) -> str:
        state = {**self.policy.state_dict(), "source": self.source.state_dict(),
                 "consecutive_skips": self.consecutive_skips, "version": self.version}
        models = {"actor": self.policy.checkpoint_model()}
        if self.critic is not None:
            models["critic"] = self.critic.saved
            state.update(self.critic.state_dict())
        if self.reference is not None and self.reference.model is not None:
            # the policy as RL began; not reloadable from a path after a warm start
            models["ref"] = self.reference.model
        rng = self.dist.gather_objects(ckpt.rng_state())
        # Sharded models (a LoRA checkpoint's: its ``module``) are saved from their full weights (collective).
        sharded = {k: getattr(m, "module", m) for k, m in models.items()}
        weights = {k: fsdp.full_state_dict(m) for k, m in sharded.items() if fsdp.is_sharded(m)}
        if not self.dist.is_main:
            return ""
        return ckpt.save_checkpoint(self.run_dir, self.step, models=models, tokenizer=self.processor or self.tokenizer,
                                    state={**state, "rng": rng}, keep_last=self.cfg.saver.keep_last, weights=weights,
                                    settings=settings_of(self.cfg), start_norm=self.start_norm)


__all__ = ["Trainer", "check_image_support", "seed_everything"]
