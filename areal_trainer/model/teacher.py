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


PROCESSOR_BOOKKEEPING = ("processor_class", "_processor_class", "image_processor_type")
"""Keys of an image processor's config that name its class, not what it makes of an image."""


def image_problem(student: tuple, teacher: tuple, *, key: str, path: str, student_key: str,
                  student_path: str) -> str | None:
    """One message when a teacher cannot score image rows as the student sees them: a text-only teacher, another
    image token, or an image processor that would make other pixel values (the teacher is given the student's).
    ``student``, ``teacher``: each its ``(processor, tokenizer)``; a text-only model's processor is None."""
    (student_processor, _), (teacher_processor, _) = student, teacher
    if teacher_processor is None:
        return (f"{key}={path!r} is a text-only model, and training rows have images: the teacher scores the "
                "student's rows with their images, so it must be an image-text-to-text model of the student's "
                f"family ({student_key}={student_path!r}), or remove the image rows.")
    from .vision import VisionEncoder

    a, b = (VisionEncoder(p, tok).image_token_id for p, tok in (student, teacher))
    if a != b:
        return (f"{key}={path!r}: its image token has id {b}, the student's ({student_key}={student_path!r}) {a}: "
                "the rows' image tokens would mean nothing to it. Use a teacher of the student's family.")
    mine, theirs = (_image_config(p) for p in (student_processor, teacher_processor))
    if mine != theirs:
        keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        shown = ", ".join(f"{k} {theirs.get(k)!r} vs {mine.get(k)!r}" for k in keys[:3])
        return (f"{key}={path!r}: its image processor differs from the student's ({student_key}={student_path!r}): "
                f"{shown}. The teacher is given the pixel values the student's processor made, so both need the "
                "same image processor (the same model family and image size).")
    return None


def _image_config(processor) -> dict:
    config = processor.image_processor.to_dict()
    return {k: v for k, v in config.items() if k not in PROCESSOR_BOOKKEEPING}


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
