"""Write the built-in picture task as files: ``<dir>/train.jsonl`` and ``<dir>/test.jsonl`` in TRL's vision layout,
with the pictures as PNG files in ``<dir>/pictures/`` (paths relative to the files)::

    python -m examples.vlm.make_data data/vlm --train 2000 --test 200 --size 32

Each picture is a coloured square (red, green, blue or yellow; its size and place vary) on grey, and the
question asks for its colour in one word (``areal_trainer/data/pictures.py``). The two splits use disjoint seeds.
"""

from __future__ import annotations

import argparse

from areal_trainer.data.pictures import write_rows


def main(directory: str, train: int, test: int, size: int) -> list[str]:
    return [write_rows(directory, "train", train, size), write_rows(directory, "test", test, size)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--size", type=int, default=32)
    print("\n".join(main(**vars(parser.parse_args()))))
