"""Image prompts in TRL's vision layout (``data/vision.py``): paths relative to the file, an ``image`` column, several
images per prompt, rows without images in the same file, Parquet with ``datasets.Image`` features, PIL images;
images scaled down to ``max_pixels``; and every bad input is one message naming the row and the image, before
any model loads."""

import json
import warnings

import pytest
from PIL import Image

from areal_trainer.config.schema import DatasetConfig
from areal_trainer.data.datasets import build_samples
from areal_trainer.data.files import Row
from areal_trainer.data.vision import ImageRef, open_image, row_images, scaled_size
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_tokenizer as text_tokenizer
from areal_trainer.model.builtin_vlm import build_processor, build_tokenizer
from areal_trainer.model.limits import RowLimit
from areal_trainer.model.vision import VisionEncoder

TOK = build_tokenizer()
ENC = VisionEncoder(build_processor(TOK), TOK)
Q = "What colour is the square?"


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": Q}]}]


IMG = {"type": "image"}


def _png(path, colour=(255, 0, 0), size=(20, 12)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _build(path, **kw):
    return build_samples(DatasetConfig(path=str(path), **kw), TOK, "train_dataset", vision=ENC,
                         model_path="builtin:tiny-vlm")


def test_paths_relative_to_the_file_one_image_column_several_images_and_text_rows(tmp_path):
    _png(tmp_path / "d" / "pics" / "a.png")
    _png(tmp_path / "d" / "pics" / "b.png", (0, 0, 255))
    path = _jsonl(tmp_path / "d" / "train.jsonl", [
        {"prompt": _user(IMG), "images": ["pics/a.png"], "answer": "red"},
        {"prompt": _user(IMG, IMG), "images": ["pics/a.png", "pics/b.png"], "answer": "red"},
        {"prompt": _user(IMG), "image": "pics/b.png", "answer": "blue"},
        {"prompt": "How many apples?", "answer": "3"},
        {"prompt": _user(), "images": [], "answer": "none"},
    ])
    one, two, single, text, empty = _build(path)
    assert one["vision"].names == ("pics/a.png",) and one["vision"].refs[0].source == str(tmp_path / "d/pics/a.png")
    assert two["vision"].names == ("pics/a.png", "pics/b.png") and single["vision"].names == ("pics/b.png",)
    assert text["vision"].refs == () and empty["vision"].refs == ()
    assert one["fields"]["images"] == ["pics/a.png"]  # rewards get the column as the row has it
    ids, vision = two["vision"].encode(two["messages"])
    assert ids.count(ENC.image_token_id) == 32 and vision.tensors["pixel_values"].shape == (2, 3, 16, 16)
    assert two["vision"].length(two["messages"]) == len(ids)  # counted from the sizes alone, without pixels
    ids, vision = text["vision"].encode(text["messages"])
    assert vision is None and ENC.image_token_id not in ids


def test_parquet_with_datasets_image_features_and_pil_images(tmp_path):
    datasets = pytest.importorskip("datasets")
    green = Image.new("RGB", (20, 12), (0, 255, 0))  # in memory: the Parquet file holds its bytes
    ds = datasets.Dataset.from_dict({"prompt": [_user(IMG)], "images": [[green]], "answer": ["green"]},
                                    features=datasets.Features({
                                        "prompt": [{"role": datasets.Value("string"), "content": [
                                            {"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
                                        "images": datasets.Sequence(datasets.Image()),
                                        "answer": datasets.Value("string")}))
    ds.to_parquet(str(tmp_path / "train.parquet"))
    (s,) = _build(tmp_path / "train.parquet")
    assert isinstance(s["vision"].refs[0].source, bytes) and s["vision"].refs[0].size == (20, 12)
    assert s["vision"].names == ("images[0] of row 1 of 'train.parquet'",)
    assert open_image(s["vision"].refs[0]).getpixel((0, 0)) == (0, 255, 0)
    # A hub dataset's rows hold PIL images (datasets decodes its Image features).
    (ref,) = row_images(Row({"images": [Image.new("RGB", (5, 7))]}, "row 1 of 'hub'"), _user(IMG), "train_dataset")
    assert ref.size == (5, 7) and ref.name == "images[0] of row 1 of 'hub'"


def test_max_pixels_scales_large_images_down_keeping_their_aspect(tmp_path):
    assert scaled_size((400, 100), 10_000) == (200, 50) and scaled_size((40, 10), 10_000) == (40, 10)
    _png(tmp_path / "big.png", size=(400, 100))
    ref = ImageRef(str(tmp_path / "big.png"), "big.png", (400, 100))
    assert open_image(ref, 10_000).size == (200, 50) and open_image(ref).size == (400, 100)


# -- bad input: one message before any model loads, naming the row, the image and the fix ----------------------
def _one_problem(path, **kw) -> str:
    with pytest.raises(UserError) as e:
        _build(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_a_missing_image_names_the_row_the_file_and_the_fix(tmp_path):
    path = _jsonl(tmp_path / "train.jsonl", [{"prompt": _user(IMG), "images": ["pics/gone.png"], "answer": "red"}])
    msg = _one_problem(path)
    assert msg.startswith("train_dataset: line 1 of 'train.jsonl': image 'pics/gone.png' does not exist (looked for "
                          f"{tmp_path / 'pics' / 'gone.png'}")
    assert "train_dataset.bad_images=skip" in msg


def test_an_unreadable_image_names_the_row_and_the_file(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not a picture")
    path = _jsonl(tmp_path / "train.jsonl", [{"prompt": _user(IMG), "images": ["bad.png"], "answer": "red"}])
    msg = _one_problem(path)
    assert msg.startswith("train_dataset: line 1 of 'train.jsonl': image 'bad.png' cannot be read as an image (")
    assert "Replace the file, or set train_dataset.bad_images=skip" in msg


def test_bad_images_skip_leaves_such_rows_out_and_counts_them(tmp_path):
    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "train.jsonl", [{"prompt": _user(IMG), "images": ["a.png"], "answer": "red"},
                                             {"prompt": _user(IMG), "images": ["gone.png"], "answer": "red"}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (s,) = _build(path, bad_images="skip")
    assert s["vision"].names == ("a.png",)
    (w,) = [str(c.message) for c in caught if "left out" in str(c.message)]
    assert w.startswith("train_dataset: left out 1 of 2 rows whose image is missing or unreadable")


@pytest.mark.parametrize("parts,images,held", [((IMG, IMG), ["a.png"], "'images' holds 1"),
                                                ((IMG,), ["a.png", "a.png"], "'images' holds 2"),
                                                ((IMG,), None, "it has no images or image column")],
                         ids=["an-image-part-without-an-image", "more-images-than-parts", "no-images-column"])
def test_image_parts_and_images_must_pair_up(tmp_path, parts, images, held):
    _png(tmp_path / "a.png")
    row = {"prompt": _user(*parts), "answer": "red", **({"images": images} if images is not None else {})}
    msg = _one_problem(_jsonl(tmp_path / "train.jsonl", [row]))
    n = len(parts)
    assert msg.startswith(f"train_dataset: line 1 of 'train.jsonl': the prompt has {n} image part{'s' * (n > 1)} "
                          f'({{"type": "image"}}) but {held}')
    assert "Give exactly one image per image part" in msg


def test_image_rows_for_a_text_only_model(tmp_path):
    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "train.jsonl", [{"prompt": _user(IMG), "images": ["a.png"], "answer": "red"}])
    with pytest.raises(UserError) as e:
        build_samples(DatasetConfig(path=path), text_tokenizer(), "train_dataset", model_path="builtin:tiny")
    assert str(e.value) == (
        "train_dataset: line 1 of 'train.jsonl' has an image ('a.png'), but actor.path='builtin:tiny' is a text-only "
        "model (no vision tower, no image processor). Use an image-text-to-text model (e.g. "
        "actor.path=builtin:tiny-vlm, a LLaVA or Qwen2-VL checkpoint), or remove the image rows.")


def test_an_image_too_large_for_the_context(tmp_path):
    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "train.jsonl", [{"prompt": _user(IMG), "images": ["a.png"], "answer": "red"}])
    text_only = ENC.prompt_length(_user(IMG), None)  # the prompt with its image as one placeholder
    limit = RowLimit(text_only + 8, f"gconfig.max_tokens={text_only + 8}", "raise gconfig.max_tokens")
    with pytest.raises(UserError) as e:
        build_samples(DatasetConfig(path=path), TOK, "train_dataset", limit, vision=ENC)
    msg = str(e.value)
    assert msg.startswith(f"train_dataset: line 1 of 'train.jsonl': its image 'a.png' makes the prompt "
                          f"{text_only + 15} tokens (the images' tokens included), past the row limit of "
                          f"{text_only + 8} (gconfig.max_tokens={text_only + 8}). Set train_dataset.max_pixels")
    assert "train_dataset.overlong_prompts=drop" in msg and "\n" not in msg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UserError, match="no usable rows"):  # drop asked for: the row is left out
            build_samples(DatasetConfig(path=path, overlong_prompts="drop"), TOK, "train_dataset", limit, vision=ENC)


def test_the_prompt_of_neither_text_nor_messages_names_the_parts_layout(tmp_path):
    path = _jsonl(tmp_path / "train.jsonl", [{"prompt": [{"role": "user", "content": [{"type": "video"}]}],
                                              "answer": "red"}])
    assert '{"type": "image"} parts' in _one_problem(path)
