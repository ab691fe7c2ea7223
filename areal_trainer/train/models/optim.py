"""Optimizer and learning-rate schedule from ``OptimizerConfig``.

The schedule is linear warm-up over ``warmup_steps_proportion`` of the run's training steps, then
constant, linear or cosine decay to ``min_lr_ratio * lr``. It steps once per training step (one batch),
so the ``ppo_n_minibatches`` optimizer steps of a batch share one learning rate.
"""

from __future__ import annotations

import math

import torch

from ...config.parts import OptimizerConfig


def build_optimizer(params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.type == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    # "adam" is AdamW (decoupled weight decay), as in AReaL's FSDP engine.
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             weight_decay=cfg.weight_decay)


def lr_factor(step: int, total: int, cfg: OptimizerConfig) -> float:
    """Multiplier of ``cfg.lr`` at training step ``step`` of ``total``."""
    warmup = int(cfg.warmup_steps_proportion * total)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if cfg.lr_scheduler_type == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    lo = cfg.min_lr_ratio
    if cfg.lr_scheduler_type == "linear":
        return lo + (1 - lo) * (1 - progress)
    return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(opt: torch.optim.Optimizer, cfg: OptimizerConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total_steps, cfg))


def restore(opt: torch.optim.Optimizer, scheduler, cfg: OptimizerConfig, scheduler_state: dict) -> None:
    """Continue a restored optimizer and schedule with *this* run's settings.

    The saved schedule gives the position (the step count); the learning rate, the schedule's shape
    and the optimizer's hyperparameters come from ``cfg``, so that a resume with a new
    ``actor.optimizer.lr`` (or schedule, or run length) uses it from the resumed step on. With the
    same settings the learning rate is the very float the run would have used."""
    scheduler.load_state_dict(scheduler_state)
    scheduler.base_lrs = [cfg.lr for _ in opt.param_groups]
    for group in opt.param_groups:
        group["initial_lr"], group["weight_decay"] = cfg.lr, cfg.weight_decay
        if "betas" in group:
            group["betas"], group["eps"] = (cfg.beta1, cfg.beta2), cfg.eps
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(opt.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs
