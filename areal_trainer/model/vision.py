"""Image-text-to-text models (vision-language models, VLMs): their processors, the images of a prompt as the
model's keyword tensors, and the training-side forward that sees them.

A VLM's config has a ``vision_config``; it loads as ``AutoModelForImageTextToText`` with ``AutoProcessor``
(LLaVA, Qwen2-VL/Qwen2.5-VL/Qwen3-VL, Idefics3/SmolVLM, Gemma 3, PaliGemma). The processor renders a
conversation (its chat template writes one placeholder token per image part), expands each placeholder to
as many image tokens as the vision tower gives features for that image, and turns the images into pixel
values: ``pixel_values [images, 3, H, W]`` for LLaVA, flattened patches ``pixel_values [patches, dim]`` with
``image_grid_thw [images, 3]`` for Qwen-VL. :class:`VisionInput` keeps one prompt's tensors as the processor
gave them; :func:`collate` concatenates the tensors of several rows in row order, which is the order in which
the model places image features onto the image tokens of a batch (row by row, left to right).

Rows of one prompt share one :class:`VisionInput` object (the rows of a group are its answers), so a batch
holds each prompt's pixels once, however many answers it has.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .chat import prompt_ids
from .packing import is_varlen, pack, packed_apply

VISION_ATTRS = ("vision_tower", "visual", "vision_model", "vision_encoder")
"""Where VLMs keep their vision encoder (LLaVA/Gemma 3, Qwen-VL, Idefics3/SmolVLM, others)."""
LANGUAGE_ATTRS = ("language_model", "text_model")
"""Where VLMs keep their language model."""


@dataclass(frozen=True)
class VisionInput:
    """One prompt's processed images: the keyword tensors the model takes with ``input_ids`` (``pixel_values``
    and, by family, ``image_grid_thw`` or ``image_sizes``), each with the prompt's images (or their patches)
    along dimension 0, in the order of the image parts."""

    tensors: dict[str, torch.Tensor]
    n_images: int
    names: tuple[str, ...] = ()
    """The images as the dataset names them (file paths, or the column and index), for messages and samples."""


def collate(inputs: Sequence[VisionInput | None], device: torch.device | None = None,
            dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The model's keyword tensors of rows with ``inputs`` (None: a text row), concatenated in row order;
    floating tensors in ``dtype`` (the model's weights'). ``{}`` when no row has images."""
    present = [v for v in inputs if v is not None and v.n_images]
    if not present:
        return {}
    out = {}
    for key in present[0].tensors:
        t = torch.cat([v.tensors[key] for v in present])
        out[key] = t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else None)
    return out


def has_images(inputs: Sequence[VisionInput | None] | None) -> bool:
    return bool(inputs) and any(v is not None and v.n_images for v in inputs)


def image_names(vision: Sequence[VisionInput | None]) -> list[tuple[str, ...]]:
    """Each row's image names (empty for a text row); an empty list when no row has images."""
    if not has_images(vision):
        return []
    return [v.names if v is not None else () for v in vision]


def is_vlm_config(config: Any) -> bool:
    """Whether a transformers config is an image-text-to-text model's (it has a vision tower)."""
    return getattr(config, "vision_config", None) is not None


def is_vlm(model: torch.nn.Module) -> bool:
    return is_vlm_config(getattr(model, "config", None))


def _first_attr(module: torch.nn.Module, names: Sequence[str]) -> torch.nn.Module | None:
    for holder in (module, getattr(module, "model", None), getattr(module, "base_model", None)):
        for name in names:
            found = getattr(holder, name, None) if holder is not None else None
            if isinstance(found, torch.nn.Module):
                return found
    return None


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's vision encoder (None for a text-only model)."""
    return _first_attr(model, VISION_ATTRS) if is_vlm(model) else None


def freeze_vision(model: torch.nn.Module) -> int:
    """Freeze the vision encoder's parameters (the projector and language model stay trainable); returns how
    many parameters were frozen (0 for a text-only model)."""
    tower = vision_tower(model)
    if tower is None:
        return 0
    n = 0
    for p in tower.parameters():
        if p.requires_grad:
            p.requires_grad_(False)
            n += p.numel()
    return n


def language_model_prefix(model: torch.nn.Module) -> str | None:
    """The qualified name of the VLM's language model inside ``model`` (``model.language_model``), or None."""
    lm = _first_attr(model, LANGUAGE_ATTRS) if is_vlm(model) else None
    if lm is None:
        return None
    return next((name for name, m in model.named_modules() if m is lm), None)


def uses_3d_positions(backbone: torch.nn.Module) -> bool:
    """Whether the model places image tokens with 3-D rotary positions (Qwen-VL's M-RoPE): such rows cannot be
    packed by restarting 1-D positions; their forward is the padded one."""
    return any(callable(getattr(m, "get_rope_index", None)) for m in (backbone, getattr(backbone, "model", None)))


def token_types(model: torch.nn.Module, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each token's modality for models that take it with the ids (Qwen-VL in transformers 5:
    ``mm_token_type_ids``, 1 on image tokens, 0 elsewhere, from which they compute their 3-D positions); ``{}``
    for the others. Derived from the ids, so it needs no padding or extending of its own."""
    if "mm_token_type_ids" not in inspect.signature(type(model).forward).parameters:
        return {}
    image = getattr(model.config, "image_token_id", None)
    return {} if image is None else {"mm_token_type_ids": (input_ids == image).long()}


def _row_kwargs(inputs: Sequence[VisionInput | None], dtype: torch.dtype, device: torch.device
                ) -> Callable[[list[int]], dict]:
    return lambda order: collate([inputs[r] for r in order], device, dtype)


def vision_hidden(backbone: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  inputs: Sequence[VisionInput | None], *, packing: bool, max_pack_tokens: int | None = None
                  ) -> torch.Tensor:
    """``[N, H]`` last hidden states of the real tokens (row-major) of a right-padded batch whose rows have the
    images ``inputs`` (one per row, None for a text row), the VLM's backbone placing the image features on the
    image tokens. ``packing``: the rows packed as the text forward packs them (``model/packing.py``), each pack
    row's images in the order its rows were placed; models with 3-D positions always run the padded batch."""
    param = next(backbone.parameters())
    if packing and not uses_3d_positions(backbone):
        def fn(ids: torch.Tensor, pos: torch.Tensor, kwargs: dict) -> torch.Tensor:
            return backbone(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False,
                            **kwargs).last_hidden_state

        return packed_apply(fn, input_ids, attention_mask, max_pack_tokens=max_pack_tokens,
                            varlen=is_varlen(backbone), row_kwargs=_row_kwargs(inputs, param.dtype, param.device))
    out = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                   **collate(inputs, param.device, param.dtype), **token_types(backbone, input_ids))
    return pack(out.last_hidden_state, attention_mask)


def vision_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  inputs: Sequence[VisionInput | None]) -> torch.Tensor:
    """``[N, V]`` logits of the real tokens from the whole VLM (padded forward), for heads the chunked path
    cannot reproduce."""
    param = next(model.parameters())
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                **collate(inputs, param.device, param.dtype), **token_types(model, input_ids))
    return pack(out.logits, attention_mask)


def prompt_inputs(tokenizer, sample: dict) -> tuple[list[int], VisionInput | None]:
    """A dataset sample's prompt as token ids, with its processed images (None for a text prompt): an image
    sample carries its images and the run's processor (``sample["vision"]``, ``data/vision.py``)."""
    vision = sample.get("vision")
    if vision is None:
        return prompt_ids(tokenizer, sample["messages"]), None
    return vision.encode(sample["messages"])


class VisionEncoder:
    """A VLM's processor as the trainer uses it: renders a conversation (string contents as one text part each,
    TRL's layout), expands its image placeholders and processes the images (:meth:`encode`), and counts a
    prompt's tokens from its images' sizes alone (:meth:`prompt_length`)."""

    SKIPPED = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
    """Processor outputs that are per token, not per image: the trainer makes its own."""

    def __init__(self, processor, tokenizer):
        self.processor, self.tokenizer = processor, tokenizer
        token = getattr(processor, "image_token", None) or "<image>"
        self.image_token_id = getattr(processor, "image_token_id", None) or tokenizer.convert_tokens_to_ids(token)
        self.template = getattr(processor, "chat_template", None) or tokenizer.chat_template

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        parts = [m if not isinstance(m.get("content"), str) else {**m, "content": [{"type": "text",
                                                                                    "text": m["content"]}]}
                 for m in messages]
        return self.tokenizer.apply_chat_template(parts, chat_template=self.template, add_generation_prompt=True,
                                                  tokenize=False, tools=tools or None)

    def encode(self, messages: list[dict], images: list, names: tuple[str, ...] = (),
               tools: list[dict] | None = None) -> tuple[list[int], VisionInput | None]:
        """Token ids of the prompt (its image tokens expanded) and its images' tensors (None without images);
        ``tools``: the function tools the template shows (an agent's request)."""
        text = self.render(messages, tools)
        if not images:
            return self.tokenizer(text, add_special_tokens=False).input_ids, None
        out = self.processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
        tensors = {k: v for k, v in out.items() if k not in self.SKIPPED and isinstance(v, torch.Tensor)}
        return out["input_ids"][0].tolist(), VisionInput(tensors, len(images), tuple(names))

    def image_tokens(self, sizes: Sequence[tuple[int, int]]) -> list[int]:
        """How many image tokens images of ``sizes`` (``(width, height)``) become."""
        if not sizes:
            return []
        count = getattr(self.processor, "_get_num_multimodal_tokens", None)
        if callable(count):
            try:
                found = count(image_sizes=[(h, w) for w, h in sizes])
                n = found["num_image_tokens"] if isinstance(found, dict) else found.num_image_tokens
                if n is not None and len(n) == len(sizes):
                    return [int(x) for x in n]
            except (AttributeError, KeyError, TypeError, ValueError):
                pass
        from PIL import Image  # a processor that cannot count: process a blank image of each size

        out = []
        for w, h in sizes:
            ids = self.processor(text=[self.processor_image_text()], images=[Image.new("RGB", (w, h))],
                                 return_tensors="pt")["input_ids"][0]
            out.append(int((ids == self.image_token_id).sum()))
        return out

    def processor_image_text(self) -> str:
        return self.render([{"role": "user", "content": [{"type": "image"}]}])

    def prompt_length(self, messages: list[dict], sizes: Sequence[tuple[int, int]] | None) -> int:
        """The prompt's tokens with its images of ``sizes`` expanded (None: each image one placeholder token)."""
        ids = self.tokenizer(self.render(messages), add_special_tokens=False).input_ids
        if sizes is None:
            return len(ids)
        placeholders = sum(1 for t in ids if t == self.image_token_id)
        return len(ids) - placeholders + sum(self.image_tokens(sizes))
