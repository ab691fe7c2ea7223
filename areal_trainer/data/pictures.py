"""The built-in picture task (``builtin:squares``): generated pictures of one coloured square on a grey
background, and the question of its colour, for image-text-to-text models; made offline and deterministic.

A row is in TRL's vision layout (``data/vision.py``): ``prompt`` is a user message of an image part and the
question, ``images`` holds the picture (a PIL image), ``answer`` the colour's name. The square's size and
place vary from picture to picture, so the colour is all the pictures of one answer share. ``write_rows``
writes such rows as a ``.jsonl`` file with the pictures as PNG files beside it (paths relative to the
file), for the examples and the tests of file datasets.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 215, 30)}
"""The colours of the squares, by name (RGB)."""
QUESTION = "What colour is the square? Answer with one word."
BACKGROUND = (128, 128, 128)
SPLIT_SEEDS = {"train": 0, "test": 1}


def picture(colour: tuple[int, int, int], size: int, rng: random.Random):
    """A ``size`` x ``size`` grey picture with one square of ``colour`` (a third to two thirds of its side)."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (size, size), BACKGROUND)
    side = rng.randint(max(1, size // 3), max(1, 2 * size // 3))
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    ImageDraw.Draw(im).rectangle([x, y, x + side - 1, y + side - 1], fill=colour)
    return im


def generate(split: str, n: int, size: int = 32, colours: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """``n`` rows of the ``train`` or ``test`` split (disjoint seeds), colours in turn."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"builtin:squares has the splits {', '.join(SPLIT_SEEDS)}; got {split!r}")
    names = list(colours or COLOURS)
    rng = random.Random(SPLIT_SEEDS[split])
    rows = []
    for i in range(n):
        name = names[i % len(names)]
        rows.append({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
                     "images": [picture(COLOURS[name], size, rng)], "answer": name})
    return rows


def write_rows(directory: str, split: str, n: int, size: int = 32, name: str | None = None) -> str:
    """Write ``n`` rows of ``split`` as ``<directory>/<name or split>.jsonl`` with the pictures as PNG files in
    ``<directory>/pictures/``; returns the file's path."""
    stem = name or split
    os.makedirs(os.path.join(directory, "pictures"), exist_ok=True)
    path = os.path.join(directory, f"{stem}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for i, row in enumerate(generate(split, n, size)):
            rel = os.path.join("pictures", f"{stem}-{i}.png")
            row["images"][0].save(os.path.join(directory, rel))
            f.write(json.dumps({**row, "images": [rel]}) + "\n")
    return path
