"""The models besides the policy: the frozen reference policy (for the KL penalty) and the PPO
critic. Both start from the policy as it is when RL begins (after any warm start) when their
``path`` is the actor's, and from their own ``path`` otherwise; a resumed run reloads them from
the checkpoint.

Under FSDP2 both are built from the whole policy *before* it is sharded (a sharded module holds
only this rank's shards and cannot be deep-copied into a working model); the reference policy then
stays replicated (it has no gradients or optimizer state), the critic is sharded like the policy.

With ``actor.use_lora`` and ``ref.path`` equal to the actor's, the reference policy is the policy
with its adapter turned off (``model/lora.py``), not a copy: ``build_ref`` returns None and
``ref_is_base`` says so. The critic is copied from the policy before the adapters are attached.
"""

from __future__ import annotations

import copy
import os

import torch

from ..config.schema import TrainerConfig
from ..fsdp import is_sharded
from ..model.critic import ValueModel
from ..model.load import load_causal_lm


def _copy(actor: torch.nn.Module) -> torch.nn.Module:
    if is_sharded(actor):
        raise RuntimeError("build the reference policy and critic before sharding the policy (FSDP2)")
    return copy.deepcopy(actor)


def ref_is_base(cfg: TrainerConfig) -> bool:
    """Whether the reference policy is the LoRA policy's base model (adapter off)."""
    return cfg.actor.kl_ctl > 0 and cfg.ref is not None and cfg.actor.use_lora and cfg.ref.path == cfg.actor.path


def build_ref(cfg: TrainerConfig, actor: torch.nn.Module, tokenizer, device: torch.device,
              resume_dir: str | None) -> torch.nn.Module | None:
    """A frozen reference policy when ``actor.kl_ctl > 0`` (config validation ensures ``ref`` is set)."""
    if cfg.actor.kl_ctl <= 0 or cfg.ref is None or ref_is_base(cfg):
        return None
    if resume_dir and os.path.isdir(os.path.join(resume_dir, "ref")):
        ref = load_causal_lm(os.path.join(resume_dir, "ref"), tokenizer=tokenizer, dtype=cfg.ref.dtype,
                             device=device, seed=cfg.seed, key="ref.path")
    elif cfg.ref.path == cfg.actor.path:
        ref = _copy(actor)
    else:
        ref = load_causal_lm(cfg.ref.path, tokenizer=tokenizer, dtype=cfg.ref.dtype, device=device, seed=cfg.seed,
                             key="ref.path")
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def build_critic(cfg: TrainerConfig, actor: torch.nn.Module, tokenizer, device: torch.device,
                 resume_dir: str | None) -> ValueModel | None:
    if cfg.critic is None:
        return None
    if resume_dir:
        critic = ValueModel.from_pretrained(os.path.join(resume_dir, "critic"))
    elif cfg.critic.path == cfg.actor.path and not cfg.critic.init_from_scratch:
        critic = ValueModel.from_causal_lm(_copy(actor))
    else:
        lm = load_causal_lm(cfg.critic.path, tokenizer=tokenizer, dtype=cfg.critic.dtype, device=device,
                            seed=cfg.seed, key="critic.path", init_from_scratch=cfg.critic.init_from_scratch)
        critic = ValueModel.from_causal_lm(lm)
    if cfg.critic.gradient_checkpointing:
        critic.gradient_checkpointing_enable()
    return critic.to(device)
