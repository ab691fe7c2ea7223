"""On-policy distillation on image rows: the teacher is given each row's images as the student saw them (its
log-probs equal its own forward with those images, and change with the picture); a teacher that cannot see
them as the student does is named before any weights load."""

import types

import pytest
import torch
from PIL import Image

from areal_trainer.components.distill import DistillSpec, TeacherSpec
from areal_trainer.config.parts import MicroBatchSpec
from areal_trainer.errors import UserError
from areal_trainer.model import builtin_vlm
from areal_trainer.model.vision import VisionEncoder
from areal_trainer.train.models.logprobs import forward_logprobs
from areal_trainer.train.models.teacher import Teachers, check_teachers

TOK = builtin_vlm.build_tokenizer()
PROCESSOR = builtin_vlm.build_processor(TOK)
ENC = VisionEncoder(PROCESSOR, TOK)
Q = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]}]
COLOURS = [(220, 30, 30), (30, 170, 40)]
ANSWERS = [(5, 6, 7), (5, 6)]


def _spec(path="builtin:tiny-vlm"):
    return DistillSpec(form="joint", rl_weight=0.0, distill_weight=1.0,
                       teachers=(TeacherSpec("teacher", "teacher.path", path, "float32", 1.0),), identifier=None,
                       routes={}, mb_spec=MicroBatchSpec(), enable_tree_training=False)


def _batch(colours):
    """One group per picture: its prompt and two answers, right-padded, answers trained on; each row's images."""
    rows, masks, vision = [], [], []
    for colour in colours:
        ids, v = ENC.encode(Q, [Image.new("RGB", (16, 16), colour)])
        for a in ANSWERS:
            rows.append(ids + list(a))
            masks.append([0] * len(ids) + [1] * len(a))
            vision.append(v)
    width = max(map(len, rows))
    pad = [[0] * (width - len(r)) for r in rows]
    return types.SimpleNamespace(
        input_ids=torch.tensor([r + p for r, p in zip(rows, pad)]),
        attention_mask=torch.tensor([[1] * len(r) + p for r, p in zip(rows, pad)]),
        loss_mask=torch.tensor([m + p for m, p in zip(masks, pad)]), group_sizes=(2,) * len(colours),
        prompt_ids=tuple(range(len(colours))), vision=tuple(vision))


def test_the_teacher_scores_image_rows_with_their_images():
    teacher = builtin_vlm.build_model("builtin:tiny-vlm", TOK, 3).eval()
    batch = _batch(COLOURS)
    got, _ = Teachers(_spec(), {"teacher": teacher}, torch.device("cpu"), samples=None).score(batch, None, step=1)
    for r in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[r].sum())
        alone, _ = forward_logprobs(teacher, batch.input_ids[r:r + 1, :n], batch.attention_mask[r:r + 1, :n],
                                    temperature=1.0, vision=[batch.vision[r]], packing=False)
        trained = batch.loss_mask[r, 1:n].bool()
        torch.testing.assert_close(got.logp[r, :n - 1][trained], alone[0, :n - 1][trained], rtol=1e-5, atol=1e-5)
        assert torch.equal(got.weight[r, :n - 1].bool(), trained)
    # The same tokens on the other picture: other teacher log-probs.
    swapped, _ = Teachers(_spec(), {"teacher": teacher}, torch.device("cpu"), samples=None).score(
        _batch(COLOURS[::-1]), None, step=1)
    assert (swapped.logp[0] - got.logp[0]).abs().max() > 1e-3
    torch.testing.assert_close(swapped.logp[:2], got.logp[2:], rtol=0, atol=1e-5)


def _check(path):
    check_teachers(_spec(path), TOK, student_key="actor.path", student_path="builtin:tiny-vlm", samples=[],
                   processor=PROCESSOR, images=True)


def _refused(path) -> str:
    """The message of the error ``_check`` raises for the teacher at ``path``."""
    with pytest.raises(UserError) as info:
        _check(str(path))
    return str(info.value)


def test_a_teacher_that_sees_images_as_the_student_does_passes():
    _check("builtin:tiny-vlm")


def test_a_text_only_teacher_on_image_rows_is_named_before_any_weights_load(tmp_path):
    from transformers import LlamaConfig

    from areal_trainer.model import builtin

    config: LlamaConfig = builtin.build_config("builtin:tiny", TOK)
    text = builtin.build_model("builtin:tiny", TOK, 0).__class__(config)
    text.save_pretrained(tmp_path / "text")
    TOK.save_pretrained(tmp_path / "text")
    msg = _refused(tmp_path / "text")
    assert f"teacher.path='{tmp_path / 'text'}' is a text-only model, and training rows have images" in msg
    assert "actor.path='builtin:tiny-vlm'" in msg
    # Without image rows the same teacher is fine.
    check_teachers(_spec(str(tmp_path / "text")), TOK, student_key="actor.path", student_path="builtin:tiny-vlm",
                   samples=[], processor=PROCESSOR, images=False)


def test_a_teacher_with_another_image_processor_is_named_with_what_differs(tmp_path):
    model = builtin_vlm.build_model("builtin:tiny-vlm", TOK, 0)
    processor = builtin_vlm.build_processor(TOK)
    processor.image_processor.size = {"shortest_edge": 32}
    model.save_pretrained(tmp_path / "vlm")
    processor.save_pretrained(tmp_path / "vlm")
    msg = _refused(tmp_path / "vlm")
    assert f"teacher.path='{tmp_path / 'vlm'}': its image processor differs from the student's" in msg
    assert "size {'shortest_edge': 32} vs {'shortest_edge': 16}" in msg
