"""LoRA adapters through ``peft`` (``actor.use_lora``, ``critic.use_lora``).

``attach`` injects the adapters *in place*: the policy module the trainer holds stays the same
object (now with LoRA layers, base weights frozen) and ``PeftModel.get_base_model()`` returns it,
so generation on the policy runs with the adapter active. The ``PeftModel`` is what saves the
adapter and what turns it off for the reference policy (``reference_policy``).

Engines that hold their own weights (vLLM, a rollout copy) receive ``merged_state_dict``: base +
B·A·scale under the base model's parameter names, computed without touching the training model.

A checkpoint's ``actor/`` holds the adapter (``save_pretrained``), ``lora_base.json`` naming the base
model, and, when the base weights differ from what that path loads (after the supervised warm
start), the base weights themselves in ``base_model.pt``. The critic's adapters sit on its backbone
(the value head stays a plain, fully trained Linear); its ``critic/`` holds the same files for the
backbone plus ``value_head.pt``.

Under FSDP2 a module's own state dict holds only this rank's shards: the checkpoint and the merged
weights are then computed from the full state dict the caller gathered (``state``/``state_dict``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings

import torch

from ..errors import UserError
from .critic import HEAD_FILE
from .vision import language_model_prefix

BASE_FILE = "base_model.pt"
BASE_INFO = "lora_base.json"
ADAPTER_CONFIG = "adapter_config.json"


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's Linear modules (the vocabulary head excluded)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and m is not head})


def lora_config(cfg, model: torch.nn.Module, key: str = "actor", task_type: str = "CAUSAL_LM"):
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
    lm = language_model_prefix(model)
    if lm is not None:  # an image-text-to-text model: adapters on its language model only, the vision side as is
        names = linear_names(dict(model.named_modules())[lm]) if targets == ["all-linear"] else targets
        chosen: str | list[str] = rf"^{re.escape(lm)}\..*\.({'|'.join(map(re.escape, names))})$"
    else:
        chosen = "all-linear" if targets == ["all-linear"] else targets
    return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=chosen, task_type=task_type)


@contextlib.contextmanager
def quiet_peft():
    """peft asks transformers for a renamed attribute; the warning says nothing about the run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def merged_with_adapter(model: torch.nn.Module, adapter_dir: str) -> torch.nn.Module:
    """``model`` (the adapter's base) with the LoRA adapter saved in ``adapter_dir`` merged in: one plain model."""
    from peft import PeftModel

    with quiet_peft():
        return PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()


def attach(model: torch.nn.Module, cfg, *, seed: int, adapter_dir: str | None = None, key: str = "actor",
           task_type: str = "CAUSAL_LM"):
    """Inject LoRA adapters into ``model`` in place and return the ``PeftModel``: new ones (seeded), or
    trainable ones loaded from ``adapter_dir`` (a checkpoint's ``actor/`` or ``critic/``). ``task_type``:
    ``CAUSAL_LM`` for the policy, ``FEATURE_EXTRACTION`` for a backbone without a vocabulary head."""
    from peft import PeftModel, get_peft_model

    with torch.random.fork_rng(devices=[]), quiet_peft():
        torch.manual_seed(seed)
        if adapter_dir is not None:
            peft = PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
        else:
            peft = get_peft_model(model, lora_config(cfg, model, key, task_type))
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
def merged_state_dict(peft, *, merge: bool = True, state: dict[str, torch.Tensor] | None = None
                      ) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's names: base + B·A·scale of the active adapter
    (``merge=False``: the frozen base weights alone). New tensors; the training model is unchanged.

    ``state``: the base model's full state dict, when its own holds only shards (FSDP2)."""
    from peft.utils.other import transpose

    base = peft.get_base_model()
    if state is None:
        state = base.state_dict()
    out = {}
    for name, t in state.items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = t.detach().clone()
    if merge:
        for name, layer in _lora_layers(base).items():
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    a, b = state[f"{name}.lora_A.{adapter}.weight"], state[f"{name}.lora_B.{adapter}.weight"]
                    # peft's own merge (get_delta_weight), in float32 so half-precision weights lose nothing more
                    delta = transpose(b.float() @ a.float(), layer.fan_in_fan_out) * layer.scaling[adapter]
                    w = out[f"{name}.weight"]
                    out[f"{name}.weight"] = w + delta.to(w.dtype)
    return out


@contextlib.contextmanager
def reference_policy(peft):
    """The base model with the adapter turned off: the reference policy, with no second copy."""
    with peft.disable_adapter():
        yield peft.get_base_model()


PEFT_PREFIX = "base_model.model."
"""What the ``PeftModel`` puts before the adapted model's parameter names."""


class AdapterCheckpoint:
    """What a checkpoint's ``actor/`` saves with LoRA (``save_pretrained(path)``, like a model).

    ``module`` is the model whose full state dict a sharded run passes to ``save_pretrained``, and
    ``prefix`` the adapted model's name inside it ("" for the policy, ``backbone.`` for the critic)."""

    def __init__(self, peft, base_path: str, save_base: bool, module: torch.nn.Module | None = None,
                 prefix: str = ""):
        self.peft, self.base_path, self.save_base = peft, base_path, save_base
        self.module, self.prefix = (peft.get_base_model() if module is None else module), prefix

    def _part(self, state: dict, prefix: str) -> dict:
        return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

    def save_pretrained(self, path: str, state_dict: dict | None = None) -> None:
        base_state = None if state_dict is None else self._part(state_dict, self.prefix)
        if base_state is None:
            self.peft.save_pretrained(path)
        else:
            self.peft.save_pretrained(path, state_dict={PEFT_PREFIX + k: v for k, v in base_state.items()})
        if self.save_base:
            torch.save(merged_state_dict(self.peft, merge=False, state=base_state), os.path.join(path, BASE_FILE))
        with open(os.path.join(path, BASE_INFO), "w") as f:
            json.dump({"base": self.base_path, "base_weights": BASE_FILE if self.save_base else None}, f)


class ValueAdapterCheckpoint(AdapterCheckpoint):
    """A checkpoint's ``critic/`` with LoRA: the backbone's adapter (as for the policy) and the value head."""

    def __init__(self, critic: torch.nn.Module, peft, base_path: str, save_base: bool):
        super().__init__(peft, base_path, save_base, module=critic, prefix="backbone.")

    def save_pretrained(self, path: str, state_dict: dict | None = None) -> None:
        super().save_pretrained(path, state_dict)
        head = self.module.value_head.state_dict() if state_dict is None else self._part(state_dict, "value_head.")
        torch.save({k: v.detach().cpu().clone() for k, v in head.items()}, os.path.join(path, HEAD_FILE))


def is_adapter_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def resume_adapter_dir(checkpoint: str | None, name: str, use_lora: bool) -> str | None:
    """``<checkpoint>/<name>`` when it holds a LoRA adapter (else None); a UserError naming
    ``{name}.use_lora`` when that does not match ``use_lora``."""
    if checkpoint is None:
        return None
    path = os.path.join(checkpoint, name)
    adapter = is_adapter_dir(path)
    if adapter != use_lora:
        held = "a LoRA adapter" if adapter else "full weights, not a LoRA adapter"
        raise UserError(f"{name}.use_lora={str(use_lora).lower()}: {path} holds {held}; resume it with "
                        f"{name}.use_lora={str(not use_lora).lower()}.")
    return path if adapter else None


def adapter_base(adapter_dir: str) -> dict:
    """What a LoRA checkpoint says of its base: ``{"base": <path>, "base_weights": <file or None>}``."""
    with open(os.path.join(adapter_dir, BASE_INFO)) as f:
        return json.load(f)


def load_base_weights(model: torch.nn.Module, adapter_dir: str, base_path: str, key: str = "actor") -> bool:
    """Before ``attach(..., adapter_dir=...)``: check the checkpoint's base and load its saved base
    weights into ``model`` (the base from ``base_path``), if any; returns whether there were some."""
    info = adapter_base(adapter_dir)
    if info["base"] != base_path:
        raise UserError(f"{key}.path: got {base_path!r}, but the checkpoint {adapter_dir} holds a LoRA adapter for "
                        f"{info['base']!r}; resume with {key}.path={info['base']}.")
    if info["base_weights"] is None:
        return False
    model.load_state_dict(torch.load(os.path.join(adapter_dir, info["base_weights"]), weights_only=True))
    return True
