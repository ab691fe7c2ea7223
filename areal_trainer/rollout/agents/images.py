"""Images in chat messages, as the OpenAI chat API carries them: ``{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}`` content parts.

An agent of an image-text-to-text policy sends the pictures of its conversation this way, in process or over
HTTP. The trainer fetches nothing from the network, so an image comes as a data URL (any format PIL reads);
:func:`image_url` makes one from a PIL image, a file or its bytes. The dataset row an agent gets already
carries its prompt's images so (:func:`with_image_urls`): an agent that sends ``data["messages"]`` on sends
its pictures too.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Sequence
from typing import Any

MAX_IMAGE_BYTES = 20 * 2 ** 20
"""The largest image one part may carry (decoded), as OpenAI limits an image input."""


class BadImage(ValueError):
    """An image part that cannot be read: the message says why, for the agent's 400."""


def image_url(image: Any) -> str:
    """A ``data:image/png;base64,...`` URL of ``image``: a PIL image, a file path, or an image file's bytes."""
    from PIL import Image

    if isinstance(image, str | os.PathLike):
        with open(image, "rb") as f:
            image = f.read()
    if isinstance(image, bytes | bytearray):
        image = Image.open(io.BytesIO(image))
    if not isinstance(image, Image.Image):
        raise TypeError(f"image_url takes a PIL image, a path or bytes, got {type(image).__name__}")
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def decode_image_url(url: Any):
    """The RGB PIL image of a data URL; :class:`BadImage` naming what is wrong otherwise."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(url, str):
        raise BadImage(f"expected the image's URL as a string, got {type(url).__name__}.")
    if not url.startswith("data:"):
        shown = url if len(url) <= 80 else url[:77] + "..."
        raise BadImage(f"only data URLs (data:image/png;base64,...) are taken, got {shown!r}: the trainer fetches "
                       "nothing from the network. Send the image's bytes (areal_trainer.rollout.agents.image_url "
                       "makes the URL).")
    head, _, payload = url.partition(",")
    if not head.endswith(";base64"):
        raise BadImage(f"expected a base64 data URL (data:image/<type>;base64,...), got the header {head!r}.")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadImage(f"the data URL's base64 does not decode ({e}).") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise BadImage(f"the image has {len(data)} bytes; one image part may carry at most {MAX_IMAGE_BYTES}.")
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError) as e:
        raise BadImage(f"the data URL holds no image PIL can read ({type(e).__name__}: {e}).") from None
    return image.convert("RGB")


def with_image_urls(messages: Sequence[dict], images: Sequence[Any]) -> list[dict]:
    """``messages`` with their ``{"type": "image"}`` parts (TRL's layout) as ``image_url`` parts of ``images``, in
    order: the form an agent sends on."""
    it = iter(images)
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "image_url", "image_url": {"url": image_url(next(it))}}
                       if isinstance(p, dict) and p.get("type") == "image" else dict(p) for p in content]
        out.append({**m, "content": content})
    return out


def render_with_images(vision: Any, why_not: str, messages: list[dict], images: Sequence[Any],
                       tools: list[dict]) -> tuple[list[int], str, Any]:
    """A request with images as the policy's processor renders it (``vision``, ``model/vision.py``'s
    ``VisionEncoder``): its prompt ids, each image's placeholder expanded to its image tokens, the text and the
    processed images. :class:`BadImage` when there is no processor (``why_not`` says why) or it cannot render
    them."""
    n = len(images)
    if vision is None:
        raise BadImage(f"the request carries {n} image{'s' * (n != 1)}, but {why_not}; send text only.")
    try:
        ids, processed = vision.encode(messages, list(images), tools=tools)
        text = vision.render(messages, tools=tools)
    except Exception as e:  # noqa: BLE001 - a processor that cannot render the messages: the agent's request
        raise BadImage(f"the processor cannot render these messages with their {n} image(s): "
                       f"{type(e).__name__}: {e}") from e
    return list(ids), text, processed
