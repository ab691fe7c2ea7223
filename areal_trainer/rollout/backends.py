"""Choose the rollout backend from ``rollout.backend``.

Every backend is an :class:`~areal_trainer.rollout.types.InferenceEngine`: ``generate(prompts,
gconfig) -> list[Generation]`` (per-token behaviour logprobs and policy versions), ``version``, and
``update_weights(model, version)``, which the trainer calls after every optimizer update so the
next rollout samples from the new policy.
"""

from __future__ import annotations

import torch

from ..config.schema import TrainerConfig
from .engine import HFEngine


def make_engine(cfg: TrainerConfig, model, tokenizer, *, device: torch.device, autocast_dtype,
                interruptible: bool = False):
    """The configured engine on ``model`` (``hf``: sampling from ``model`` itself, colocated)."""
    if cfg.rollout.backend == "vllm":
        from .vllm_engine import VLLMEngine

        dtype = getattr(torch, cfg.rollout.dtype) if cfg.rollout.dtype else None
        return VLLMEngine(model, tokenizer, device=device, seed=cfg.seed, dtype=dtype, interruptible=interruptible,
                          **cfg.rollout.vllm_kwargs)
    return HFEngine(model, tokenizer, device=device, autocast_dtype=autocast_dtype,
                    batch_size=cfg.rollout.generation_batch_size, share_prefill=share_prefill(cfg))


def share_prefill(cfg: TrainerConfig) -> bool:
    """HF generation prefills a prompt once for all its samples unless shared-prefix computation is
    switched off (``actor.enable_tree_training=false``: every row computed in full, everywhere)."""
    return cfg.actor.enable_tree_training is not False
