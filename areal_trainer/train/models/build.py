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

With ``critic.use_lora`` the critic's backbone gets its own adapters (base frozen, value head fully
trained); its checkpoint holds the adapter and the head (``lora.ValueAdapterCheckpoint``), plus the base
weights when they differ from what ``critic.path`` loads (copied from a warm-started or scratch policy).
"""

from __future__ import annotations

import copy
import os

import torch

from ...config.schema import TrainerConfig
from ...fsdp import is_sharded
from ...model import lora
from ...model.critic import HEAD_FILE, ValueModel
from ...model.load import load_causal_lm, load_skeleton
from ...model.vision import freeze_vision


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


def check_critic_lora(cfg: TrainerConfig, actor: torch.nn.Module, tokenizer) -> None:
    """Bad ``critic.target_modules`` fail at start-up, not when the critic is built after the warm start."""
    c = cfg.critic
    if c is None or not c.use_lora:
        return
    model = actor if c.path == cfg.actor.path else load_skeleton(c.path, tokenizer=tokenizer, key="critic.path")
    lora.lora_config(c, model, "critic")


def build_critic(cfg: TrainerConfig, actor: torch.nn.Module, tokenizer, device: torch.device,
                 resume_dir: str | None, policy_changed: bool = False) -> tuple[ValueModel | None, object]:
    """The critic, and what a checkpoint's ``critic/`` saves of it (the model itself, or with LoRA its
    ``ValueAdapterCheckpoint``). ``policy_changed``: the policy's weights differ from what
    ``actor.path`` loads (a warm start or ``init_from_scratch``), so a critic copied from it has a base
    that only its checkpoint can restore."""
    c = cfg.critic
    if c is None:
        return None, None
    adapter_dir = lora.resume_adapter_dir(resume_dir, "critic", c.use_lora)
    base_changed = c.init_from_scratch
    if adapter_dir:
        lm = load_causal_lm(c.path, tokenizer=tokenizer, dtype=c.dtype, device=device, seed=cfg.seed,
                            key="critic.path", init_from_scratch=c.init_from_scratch)
        critic = ValueModel.from_causal_lm(lm)
        base_changed = lora.load_base_weights(critic.backbone, adapter_dir, c.path, key="critic")
        critic.value_head.load_state_dict(torch.load(os.path.join(adapter_dir, HEAD_FILE), weights_only=True))
    elif resume_dir:
        critic = ValueModel.from_pretrained(os.path.join(resume_dir, "critic"))
    elif c.path == cfg.actor.path and not c.init_from_scratch:
        critic = ValueModel.from_causal_lm(_copy(actor))
        base_changed = policy_changed
    else:
        lm = load_causal_lm(c.path, tokenizer=tokenizer, dtype=c.dtype, device=device,
                            seed=cfg.seed, key="critic.path", init_from_scratch=c.init_from_scratch)
        critic = ValueModel.from_causal_lm(lm)
    if c.gradient_checkpointing:
        critic.gradient_checkpointing_enable()
    if c.freeze_vision:
        freeze_vision(critic.backbone)
    critic = critic.to(device)
    if not c.use_lora:
        return critic, critic
    peft = lora.attach(critic.backbone, c, seed=cfg.seed, adapter_dir=adapter_dir, key="critic",
                       task_type="FEATURE_EXTRACTION")
    if c.gradient_checkpointing:  # frozen embeddings: checkpointed blocks still need an input with grad
        critic.backbone.enable_input_require_grads()
    return critic, lora.ValueAdapterCheckpoint(critic, peft, c.path, base_changed)
