"""Checkpoints: model weights (Hugging Face format), optimizer, LR schedule, data-loader position
and RNG states, written atomically.

A checkpoint is assembled in a temporary directory, marked complete by a ``COMPLETE`` file written
last, then renamed to ``checkpoints/step_<N>``. A crash at any point leaves either no
``step_<N>`` directory or a complete one; ``latest_checkpoint`` only ever returns complete ones.

A model sharded with FSDP2 holds only its rank's shards; the caller passes its full weights
(``fsdp.full_state_dict``, gathered on rank 0) in ``weights``, so every checkpoint holds plain
Hugging Face weights that load with or without FSDP.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import torch

from ..model.critic import HEAD_FILE, ValueModel

CKPT_DIR = "checkpoints"
MARKER = "COMPLETE"


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dirs(run_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint of the run, oldest first."""
    root = os.path.join(run_dir, CKPT_DIR)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith("step_") and os.path.isfile(os.path.join(path, MARKER)):
            found.append((int(name.split("_", 1)[1]), path))
    return sorted(found)


def latest_checkpoint(run_dir: str) -> str | None:
    found = checkpoint_dirs(run_dir)
    return found[-1][1] if found else None


def save_model(model, path: str, state_dict: dict | None = None) -> None:
    """``model.save_pretrained(path)``, with the weights taken from ``state_dict`` when given."""
    if state_dict is None:
        model.save_pretrained(path)
    elif isinstance(model, ValueModel):
        def part(prefix: str) -> dict:
            return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        model.backbone.save_pretrained(path, state_dict=part("backbone."))
        torch.save(part("value_head."), os.path.join(path, HEAD_FILE))
    else:
        model.save_pretrained(path, state_dict=state_dict)


def save_checkpoint(run_dir: str, step: int, *, models: dict, tokenizer, state: dict, keep_last: int,
                    weights: dict | None = None) -> str:
    """Write ``checkpoints/step_<step>`` atomically; ``state`` holds optimizer/scheduler/loader states.

    ``weights``: full state dicts by model name, for models whose own state dict is sharded."""
    root = os.path.join(run_dir, CKPT_DIR)
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step_{step}")
    tmp = os.path.join(root, f".tmp-step_{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, model in models.items():
        save_model(model, os.path.join(tmp, name), (weights or {}).get(name))
        tokenizer.save_pretrained(os.path.join(tmp, name))
    # The caller's "rng" (every rank's, gathered) wins over this process's own.
    torch.save({"rng": rng_state(), **state, "step": step}, os.path.join(tmp, "trainer_state.pt"))
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump({"step": step}, f)
    if os.path.exists(final):  # re-saving a step: swap, never leaving a half-written step_<N>
        old = final + f".old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    for _, path in checkpoint_dirs(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
    return final


def load_trainer_state(path: str) -> dict:
    return torch.load(os.path.join(path, "trainer_state.pt"), weights_only=False)
