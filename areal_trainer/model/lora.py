"""LoRA adapters through ``peft`` (``actor.use_lora``).

``attach`` injects the adapters *in place*: the policy module the trainer holds stays the same
object (now with LoRA layers, base weights frozen) and ``PeftModel.get_base_model()`` returns it,
so generation on the policy runs with the adapter active. The ``PeftModel`` is what saves the
adapter and what turns it off for the reference policy (``reference_policy``).

Engines that hold their own weights (vLLM, a rollout copy) receive ``merged_state_dict``: base +
B·A·scale under the base model's parameter names, computed without touching the training model.

A checkpoint's ``actor/`` holds the adapter (``save_pretrained``), ``lora_base.json`` naming the base
model, and, when the base weights differ from what that path loads (after the supervised warm
start), the base weights themselves in ``base_model.pt``.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings

import torch

from ..errors import UserError

BASE_FILE = "base_model.pt"
BASE_INFO = "lora_base.json"
ADAPTER_CONFIG = "adapter_config.json"


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's Linear modules (the vocabulary head excluded)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and m is not head})


def lora_config(cfg, model: torch.nn.Module, key: str = "actor"):
    """peft's ``LoraConfig`` for ``cfg`` (a ``TrainEngineConfig``); a UserError naming
    ``{key}.target_modules`` when the model lacks one of them."""
    from peft import LoraConfig

    targets = list(cfg.target_modules)
    if targets != ["all-linear"]:
        found = linear_names(model)
        missing = [t for t in targets if t not in found]
        if missing:
            raise UserError(f"{key}.target_modules: {missing} not found in {cfg.path!r}; its Linear layers are "
                            f"{found} (or give [all-linear]).")
    return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules="all-linear" if targets == ["all-linear"] else targets, task_type="CAUSAL_LM")


def attach(model: torch.nn.Module, cfg, *, seed: int, adapter_dir: str | None = None, key: str = "actor"):
    """Inject LoRA adapters into ``model`` in place and return the ``PeftModel``: new ones (seeded), or
    trainable ones loaded from ``adapter_dir`` (a checkpoint's ``actor/``)."""
    from peft import PeftModel, get_peft_model

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft asks transformers for a renamed attribute; the warning says nothing about this run.
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        torch.manual_seed(seed)
        if adapter_dir is not None:
            peft = PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
        else:
            peft = get_peft_model(model, lora_config(cfg, model, key))
    assert peft.get_base_model() is model  # injected in place
    return peft


def counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def summary(model: torch.nn.Module) -> str:
    n, m = counts(model)
    return f"LoRA: {n} trainable of {m} parameters ({100 * n / max(m, 1):.2f}%)"


def _lora_layers(base: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}


@torch.no_grad()
def merged_state_dict(peft, *, merge: bool = True) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's names: base + B·A·scale of the active adapter
    (``merge=False``: the frozen base weights alone). New tensors; the training model is unchanged."""
    base = peft.get_base_model()
    layers = _lora_layers(base)
    out = {}
    for name, t in base.state_dict().items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = t.detach().clone()
    if merge:
        for name, layer in layers.items():
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    w = out[f"{name}.weight"]
                    out[f"{name}.weight"] = w + layer.get_delta_weight(adapter).to(w.dtype)
    return out


@contextlib.contextmanager
def reference_policy(peft):
    """The base model with the adapter turned off: the reference policy, with no second copy."""
    with peft.disable_adapter():
        yield peft.get_base_model()


class AdapterCheckpoint:
    """What a checkpoint's ``actor/`` saves with LoRA (``save_pretrained(path)``, like a model)."""

    def __init__(self, peft, base_path: str, save_base: bool):
        self.peft, self.base_path, self.save_base = peft, base_path, save_base

    def save_pretrained(self, path: str) -> None:
        self.peft.save_pretrained(path)
        if self.save_base:
            torch.save(merged_state_dict(self.peft, merge=False), os.path.join(path, BASE_FILE))
        with open(os.path.join(path, BASE_INFO), "w") as f:
            json.dump({"base": self.base_path, "base_weights": BASE_FILE if self.save_base else None}, f)


def is_adapter_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def load_base_weights(model: torch.nn.Module, adapter_dir: str, base_path: str) -> bool:
    """Before ``attach(..., adapter_dir=...)``: check the checkpoint's base and load its saved base
    weights into ``model`` (the base from ``base_path``), if any; returns whether there were some."""
    with open(os.path.join(adapter_dir, BASE_INFO)) as f:
        info = json.load(f)
    if info["base"] != base_path:
        raise UserError(f"actor.path: got {base_path!r}, but the checkpoint {adapter_dir} holds a LoRA adapter for "
                        f"{info['base']!r}; resume with actor.path={info['base']}.")
    if info["base_weights"] is None:
        return False
    model.load_state_dict(torch.load(os.path.join(adapter_dir, info["base_weights"]), weights_only=True))
    return True
