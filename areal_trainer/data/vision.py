"""Image prompts in TRL's vision layout, checked when the data is built and loaded when a rollout asks.

A row's ``prompt`` (or ``messages``) is a list of chat messages whose content may be a list of parts:
``[{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]``. The images are in an
``images`` column (a list, one image per image part, in order) or an ``image`` column (one image). An image
is a file path (relative paths are relative to the directory of the file the row came from), raw bytes, a
``{"bytes": ..., "path": ...}`` record (how ``datasets.Image`` features are stored in Parquet), or a PIL
image (a ``datasets`` hub dataset with ``Image`` features). Rows without images may sit in the same file.

When the data is built (before any model loads) every image is opened and its header read, so a missing
file, bytes that are no image, a row whose image parts and images differ in number, and image rows for a
text-only model are each one message naming the row and the image. ``bad_images: skip`` leaves rows whose
image is missing or unreadable out instead (counted in one warning). The pixels are read later, when a
rollout renders the prompt (:class:`PromptImages`): an image larger than ``max_pixels`` (width x height) is
first scaled down, keeping its aspect, and the model's processor then resizes it by its own rules.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..model.vision import VisionInput
from .files import Row

IMAGE_COLUMNS = ("images", "image")
"""Where a row's images are looked for, in this order."""
PART_TYPES = ("text", "image")


@dataclass(frozen=True)
class ImageRef:
    """One image of a row: where its bytes are, how the row names it, and its size."""

    source: Any
    """An absolute file path, bytes, or a PIL image."""
    name: str
    """The path as the row writes it, or ``images[1] of line 3 of 'train.jsonl'`` for an image given inline."""
    size: tuple[int, int]
    """``(width, height)`` as stored."""


def is_part_messages(value: Any) -> bool:
    """Whether ``value`` is a chat conversation in which some content is a list of text and image parts."""
    if not (isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                        for m in value)):
        return False
    lists = [m.get("content") for m in value if isinstance(m.get("content"), list)]
    return bool(lists) and all(isinstance(m.get("content"), str | list) for m in value) and all(
        isinstance(p, dict) and p.get("type") in PART_TYPES and (p["type"] != "text" or isinstance(p.get("text"), str))
        for parts in lists for p in parts)


def image_parts(prompt: Any) -> int:
    """How many image parts a prompt's messages have (0 for a text prompt)."""
    if not isinstance(prompt, list):
        return 0
    return sum(1 for m in prompt if isinstance(m, dict) and isinstance(m.get("content"), list)
               for p in m["content"] if isinstance(p, dict) and p.get("type") == "image")


def images_column(row: Row) -> tuple[str | None, list]:
    """``(column, its images as a list)``; ``(None, [])`` when the row has none."""
    for col in IMAGE_COLUMNS:
        value = row.columns.get(col)
        if value is None:
            continue
        return col, list(value) if isinstance(value, list | tuple) else [value]
    return None, []


class ImageProblem(ValueError):
    """A row's image cannot be used: missing or unreadable (``bad_images: skip`` leaves such rows out)."""


def row_images(row: Row, prompt: Any, key: str, image_key: str = "bad_images") -> tuple[ImageRef, ...]:
    """The checked images of a row, one per image part of ``prompt``; raises :class:`UserError` for a row whose
    image parts and images differ in number, and :class:`ImageProblem` for one whose image is missing or
    unreadable (each naming the row and the image)."""
    parts = image_parts(prompt)
    column, images = images_column(row)
    if parts != len(images):
        where = f"{column!r} holds {len(images)}" if column else f"it has no {' or '.join(IMAGE_COLUMNS)} column"
        raise UserError(f"{key}: {row.where}: the prompt has {parts} image part{'s' * (parts != 1)} "
                        f"({{\"type\": \"image\"}}) but {where}. Give exactly one image per image part, in the order "
                        f"of the parts (an 'images' list, or one 'image'), or fix the prompt's parts.")
    return tuple(_ref(img, f"{column}[{i}]", row, key, image_key) for i, img in enumerate(images))


def _ref(value: Any, label: str, row: Row, key: str, image_key: str) -> ImageRef:
    from PIL import Image

    if isinstance(value, Image.Image):
        return ImageRef(value, f"{label} of {row.where}", value.size)
    if isinstance(value, dict):  # datasets.Image in Parquet: {"bytes": ..., "path": ...}
        value = value.get("bytes") or value.get("path")
    if isinstance(value, bytes | bytearray):
        return ImageRef(bytes(value), f"{label} of {row.where}", _size(io.BytesIO(value), label, row, key, image_key))
    if not isinstance(value, str) or not value:
        raise UserError(f"{key}: {row.where}: {label} is a {type(value).__name__}, not an image: give a file path, "
                        "bytes, or a PIL image.")
    path = os.path.expanduser(value)
    if not os.path.isabs(path) and row.base is not None:
        path = os.path.join(row.base, path)
    if not os.path.isfile(path):
        raise ImageProblem(f"{key}: {row.where}: image {value!r} does not exist (looked for {path}; a relative path "
                           f"is relative to the file's directory). Fix the path, or set {key}.{image_key}=skip to "
                           "leave rows with a missing or unreadable image out.")
    return ImageRef(os.path.abspath(path), value, _size(path, value, row, key, image_key))


def _size(source: Any, name: str, row: Row, key: str, image_key: str) -> tuple[int, int]:
    """The stored size of an image, read from its header; the rest of its data is checked too."""
    from PIL import Image

    try:
        with Image.open(source) as im:
            size = im.size
            im.verify()
        return size
    except Exception as e:  # noqa: BLE001 - PIL raises many types for bad data; all are the same problem here
        raise ImageProblem(f"{key}: {row.where}: image {name!r} cannot be read as an image ({type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0]}). Replace the file, or set {key}.{image_key}=skip "
                           "to leave rows with a missing or unreadable image out.") from None


def scaled_size(size: tuple[int, int], max_pixels: int | None) -> tuple[int, int]:
    """``(width, height)`` scaled down, aspect kept, to at most ``max_pixels`` pixels (unchanged when within)."""
    w, h = size
    if max_pixels is None or w * h <= max_pixels:
        return w, h
    f = math.sqrt(max_pixels / (w * h))
    return max(1, int(w * f)), max(1, int(h * f))


def open_image(ref: ImageRef, max_pixels: int | None = None):
    """The image's pixels as an RGB PIL image, scaled down to ``max_pixels`` if larger."""
    from PIL import Image

    im = ref.source if isinstance(ref.source, Image.Image) else Image.open(
        io.BytesIO(ref.source) if isinstance(ref.source, bytes) else ref.source)
    im = im.convert("RGB")
    size = scaled_size(im.size, max_pixels)
    return im if size == im.size else im.resize(size, Image.Resampling.BICUBIC)


@dataclass(frozen=True)
class PromptImages:
    """A prompt's images and the run's processor (``model/vision.py``'s ``VisionEncoder``): ``sample["vision"]``
    of every sample of a run on an image-text-to-text model (no images: a text prompt rendered the same way)."""

    refs: tuple[ImageRef, ...]
    encoder: Any
    max_pixels: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.refs)

    def open(self) -> list:
        """The prompt's images as RGB PIL images, scaled to ``max_pixels``."""
        return [open_image(r, self.max_pixels) for r in self.refs]

    def encode(self, messages: list[dict]) -> tuple[list[int], VisionInput | None]:
        """The prompt's token ids (each image part expanded to its image tokens) and its processed images."""
        return self.encoder.encode(messages, self.open(), names=self.names)

    def length(self, messages: list[dict]) -> int:
        """The prompt's tokens as :meth:`encode` gives them, counted from the images' sizes (no pixels read)."""
        return self.encoder.prompt_length(messages, [scaled_size(r.size, self.max_pixels) for r in self.refs])

    def text_length(self, messages: list[dict]) -> int:
        """The prompt's tokens without its image tokens (each image part one placeholder)."""
        return self.encoder.prompt_length(messages, None)
