"""Choose the rollout backend from ``rollout.backend``.

Every backend offers ``generate(prompts, gconfig) -> list[Generation]``, a ``version`` counter
and ``update_weights(model)``, which the trainer calls after every optimizer update so the next
rollout samples from the new policy.
"""

from __future__ import annotations

import torch

from ..config.schema import TrainerConfig
from .engine import HFEngine


def make_engine(cfg: TrainerConfig, model, tokenizer, *, device: torch.device, autocast_dtype):
    if cfg.rollout.backend == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model, tokenizer, device=device, seed=cfg.seed, **cfg.rollout.vllm_kwargs)
    return HFEngine(model, tokenizer, device=device, autocast_dtype=autocast_dtype,
                    batch_size=cfg.rollout.generation_batch_size)
