"""Checkpoints: model weights (Hugging Face format), optimizer, LR schedule, data-loader position
and RNG states, and the settings the run was trained with, written atomically.

A checkpoint is assembled in a temporary directory (``.tmp-step_<N>-<pid>``), given a manifest of
its files' sizes and checksums (``manifest.py``), marked complete by a ``COMPLETE`` file written
last (with each model's weight norm and finiteness, ``divergence.py``), then renamed to
``checkpoints/step_<N>``. A crash at any point leaves either no
``step_<N>`` directory or a complete one; ``latest_checkpoint`` only ever returns complete ones, and
only directories named ``step_<integer>`` (a user's ``step_final/`` backup is left alone). Pruning
removes ``COMPLETE`` first, so a half-deleted checkpoint never looks complete. A save that fails
(disk full, permissions) removes its own temporary directory and keeps the earlier checkpoints.

A model sharded with FSDP2 holds only its rank's shards; the caller passes its full weights
(``fsdp.full_state_dict``, gathered on rank 0) in ``weights``, so every checkpoint holds plain
Hugging Face weights that load with or without FSDP.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil

import numpy as np
import torch

from ... import faults
from ...errors import UserError
from ...model.critic import HEAD_FILE, ValueModel
from ...tracking.space import free_space
from . import manifest

CKPT_DIR = "checkpoints"
MARKER = "COMPLETE"
SETTINGS = "settings.json"
"""The run's resolved configuration when the checkpoint was written (``config/resume.py`` compares it)."""
_STEP_DIR = re.compile(r"step_(\d+)")


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
        path, m = os.path.join(root, name), _STEP_DIR.fullmatch(name)
        if m and os.path.isfile(os.path.join(path, MARKER)):
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(run_dir: str) -> str | None:
    found = checkpoint_dirs(run_dir)
    return found[-1][1] if found else None


def damage(path: str) -> str | None:
    """What is wrong with a complete checkpoint's files, or None (see ``manifest.py``)."""
    if not os.path.isfile(os.path.join(path, "trainer_state.pt")):
        return "trainer_state.pt is missing"
    return manifest.problem(path)


def resumable(run_dir: str) -> tuple[str | None, list[str]]:
    """The newest complete checkpoint whose files are intact, and one line per newer damaged one
    skipped on the way (naming the file and what is wrong)."""
    skipped = []
    for _, path in reversed(checkpoint_dirs(run_dir)):
        wrong = damage(path)
        if wrong is None:
            return path, skipped
        skipped.append(f"{path} is damaged: {wrong}")
    return None, skipped


def remove_leftovers(run_dir: str) -> list[str]:
    """Remove what interrupted saves and prunes left: temporary directories, checkpoints being
    swapped out, and ``step_<N>`` directories without ``COMPLETE``. Returns their names."""
    root = os.path.join(run_dir, CKPT_DIR)
    if not os.path.isdir(root):
        return []
    gone = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        partial = _STEP_DIR.fullmatch(name) and not os.path.isfile(os.path.join(path, MARKER))
        if os.path.isdir(path) and (name.startswith(".tmp-") or ".old-" in name or partial):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(name)
    return gone


def remove_checkpoint(path: str) -> None:
    """Delete a checkpoint, its ``COMPLETE`` marker first: interrupted, it is no longer complete."""
    try:
        os.remove(os.path.join(path, MARKER))
    except FileNotFoundError:
        pass
    faults.point("prune.after_marker")
    shutil.rmtree(path, ignore_errors=True)


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


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


def weight_stats(state_dict: dict) -> dict:
    """``{"finite": bool, "norm": float}`` of the floating-point tensors of ``state_dict`` (norm in float64;
    ``inf`` when the weights are not finite)."""
    total, finite = 0.0, True
    for value in state_dict.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            n = float(torch.linalg.vector_norm(value.detach(), dtype=torch.float64))
            if not math.isfinite(n):  # NaN or inf inside, or finite values whose norm overflows float64
                finite = finite and bool(torch.isfinite(value).all())
            total += n * n
    norm = math.sqrt(total) if finite and math.isfinite(total) else math.inf
    return {"finite": finite, "norm": norm}


def model_state(model) -> dict:
    """The state dict of what a checkpoint saves for a model (a LoRA checkpoint's: its adapted module's)."""
    return getattr(model, "module", model).state_dict()


def save_checkpoint(run_dir: str, step: int, *, models: dict, tokenizer, state: dict, keep_last: int,
                    weights: dict | None = None, settings: dict | None = None, start_norm: float | None = None) -> str:
    """Write ``checkpoints/step_<step>`` atomically; ``state`` holds optimizer/scheduler/loader states.

    ``weights``: full state dicts by model name, for models whose own state dict is sharded;
    ``settings``: the run's configuration (``SETTINGS``); ``start_norm``: the actor's weight norm when the
    run began (recorded in the marker: the first checkpoint's reference, ``divergence.py``). Raises
    :class:`UserError` naming the
    directory and the space needed when the files cannot be written."""
    root = os.path.join(run_dir, CKPT_DIR)
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step_{step}")
    tmp = os.path.join(root, f".tmp-step_{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, step, models=models, tokenizer=tokenizer, state=state, weights=weights, settings=settings,
               start_norm=start_norm)
    except Exception as e:  # noqa: BLE001 - torch, safetensors and the OS each report a full disk their own way
        written = _size(tmp) if os.path.isdir(tmp) else 0
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(_save_failure(root, step, e, written)) from e
    faults.point("checkpoint.before_rename")
    if os.path.exists(final):  # re-saving a step: swap, never leaving a half-written step_<N>
        old = final + f".old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    for _, path in checkpoint_dirs(run_dir)[:-keep_last] if keep_last > 0 else []:
        remove_checkpoint(path)
    return final


def _write(tmp: str, step: int, *, models: dict, tokenizer, state: dict, weights: dict | None,
           settings: dict | None, start_norm: float | None) -> None:
    for name, model in models.items():
        save_model(model, os.path.join(tmp, name), (weights or {}).get(name))
        tokenizer.save_pretrained(os.path.join(tmp, name))
    # The caller's "rng" (every rank's, gathered) wins over this process's own.
    torch.save({"rng": rng_state(), **state, "step": step}, os.path.join(tmp, "trainer_state.pt"))
    if settings is not None:
        with open(os.path.join(tmp, SETTINGS), "w") as f:
            json.dump(settings, f, indent=1, default=str)
    manifest.write(tmp)
    faults.point("checkpoint.before_marker")
    stats = {name: weight_stats((weights or {}).get(name) or model_state(model))
             for name, model in models.items() if name != "ref"}  # divergence.py judges them on resume
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump({"step": step, "weights": stats, "start_norm": start_norm}, f)


def _save_failure(root: str, step: int, err: BaseException, written: int) -> str:
    """One line: where the save failed, why, the free space and about how much a checkpoint needs."""
    previous = checkpoint_dirs(os.path.dirname(root))
    need = _size(previous[-1][1]) if previous else written
    why = " ".join(str(err).split())[:200] or type(err).__name__
    kept = (f"the earlier checkpoints are kept (newest: {previous[-1][1]})" if previous
            else "no earlier checkpoint exists")
    return (f"cannot write checkpoint step_{step} into {root}: {type(err).__name__}: {why}. Free space there: "
            f"{free_space(root)}; a checkpoint of this run needs about {need / 2**20:.1f} MiB. The partial "
            f"checkpoint was removed and {kept}. Free some space (or set saver.keep_last lower) and resume with "
            "recover.mode=auto.")


def load_trainer_state(path: str) -> dict:
    return torch.load(os.path.join(path, "trainer_state.pt"), weights_only=False)
