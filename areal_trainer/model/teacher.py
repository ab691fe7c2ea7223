"""Loading a frozen teacher for on-policy distillation: whatever a policy can start from (a Hugging
Face directory or hub id, ``builtin:*``, ``smollm2``) and any checkpoint of this trainer: a step
directory (``.../checkpoints/step_<N>``, its ``actor/`` is used) or an ``actor/`` directory, full
weights or a LoRA adapter (its base is loaded from the path the adapter names, with the base weights
the checkpoint saved, and the adapter merged in: the teacher is one plain model).
"""

from __future__ import annotations

import os

import torch

from ..errors import UserError
from . import lora
from .load import load_causal_lm, load_tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def model_dir(path: str) -> str:
    """The directory holding the teacher's weights: ``path``, or its ``actor/`` for a checkpoint step."""
    actor = os.path.join(path, "actor")
    if os.path.isdir(actor) and os.path.isfile(os.path.join(path, "trainer_state.pt")):
        return actor
    return path


def tokenizer_source(path: str) -> str:
    """Where the teacher's tokenizer is: its directory, or a LoRA adapter's base when the adapter has none."""
    d = model_dir(path)
    if os.path.isdir(d) and lora.is_adapter_dir(d) and not any(os.path.isfile(os.path.join(d, f))
                                                                 for f in TOKENIZER_FILES):
        return lora.adapter_base(d)["base"]
    return d


def load_teacher_tokenizer(path: str, key: str):
    return load_tokenizer(tokenizer_source(path), key=key)


def vocabulary_problem(student, teacher, *, student_key: str, student_path: str, key: str, path: str) -> str | None:
    """One message when the two tokenizers map some token to different ids (or have different vocabularies),
    naming both; None when they agree."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if a == b:
        return None
    only_a = sorted(set(a) - set(b))[:3]
    only_b = sorted(set(b) - set(a))[:3]
    moved = sorted(k for k in set(a) & set(b) if a[k] != b[k])[:3]
    detail = []
    if only_a:
        detail.append(f"only the student has {only_a}")
    if only_b:
        detail.append(f"only the teacher has {only_b}")
    if moved:
        detail.append("different ids for " + ", ".join(f"{k!r} ({a[k]} vs {b[k]})" for k in moved))
    return (f"{key}={path!r}: the teacher's vocabulary ({len(b)} tokens) differs from the student's "
            f"({student_key}={student_path!r}, {len(a)} tokens): {'; '.join(detail)}. The teacher scores the "
            "student's token ids, so both need the same tokenizer: distil from a teacher of the same model family.")


@torch.no_grad()
def load_teacher(path: str, *, tokenizer, dtype: str, device: torch.device, seed: int, key: str) -> torch.nn.Module:
    """The teacher at ``path`` on ``device``, in eval mode, without gradients (see the module docstring)."""
    d = model_dir(path)
    if os.path.isdir(d) and lora.is_adapter_dir(d):
        base = lora.adapter_base(d)["base"]
        model = load_causal_lm(base, tokenizer=tokenizer, dtype=dtype, device=device, seed=seed, key=key)
        lora.load_base_weights(model, d, base, key=key)  # the checkpoint's own base weights (a warm start), if any
        try:
            model = lora.merged_with_adapter(model, d)
        except (OSError, ValueError, RuntimeError) as e:
            raise UserError(f"{key}: cannot load the LoRA adapter in {d}: {str(e).splitlines()[0]}") from None
    else:
        model = load_causal_lm(d, tokenizer=tokenizer, dtype=dtype, device=device, seed=seed, key=key)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
