"""Qwen2-VL, whose image tokens take 3-D rotary positions (M-RoPE), on a tiny random model built from its config:
the hf engine's log-probs equal the training forward's on the same images (rows of pictures of two sizes,
so of other token counts, and a text row), which runs such rows padded, never packed; the images matter. The
pixels come from Qwen2-VL's PIL image processor. Its full processor needs torchvision (its video processor
imports it): the test of the processor is skipped, with that reason, where torchvision does not import."""

import importlib

import pytest
import torch
from PIL import Image

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.model.vision import VisionInput, uses_3d_positions
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.train.models.logprobs import forward_logprobs

from ..helpers import right_padded

transformers = pytest.importorskip("transformers")
IMAGE, START, END, EOS, PAD = 290, 292, 293, 299, 0


class Tok:
    """The little of a tokenizer the engine uses."""

    pad_token_id, eos_token_id = PAD, EOS


def _model():
    cfg = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, eos_token_id=EOS,
                         bos_token_id=1, pad_token_id=PAD),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=IMAGE, video_token_id=291, vision_start_token_id=START, vision_end_token_id=END)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.Qwen2VLForConditionalGeneration(cfg).eval()


def _prompt(colour, side):
    """A prompt with one picture, its image tokens as many as the processor's grid says."""
    images = transformers.Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 84)
    out = images(images=[Image.new("RGB", side, colour)], return_tensors="pt")
    n = int(out["image_grid_thw"].prod()) // 4  # 2x2 patches merge into one token
    ids = [5, 6, START, *[IMAGE] * n, END, 7, 8]
    return ids, VisionInput({k: out[k] for k in ("pixel_values", "image_grid_thw")}, 1, ("p.png",))


def test_engine_and_training_forward_agree_on_rows_with_3d_positions():
    model = _model()
    assert uses_3d_positions(model) and uses_3d_positions(model.base_model)
    red, blue = _prompt((220, 30, 30), (56, 56)), _prompt((30, 60, 220), (84, 56))
    assert len(red[0]) != len(blue[0])
    prompts = [red[0], red[0], blue[0], [5, 6, 7]]
    vision = [red[1], red[1], blue[1], None]
    torch.manual_seed(0)
    gens = HFEngine(model, Tok(), device=torch.device("cpu")).generate(
        prompts, GenerationHyperparameters(max_new_tokens=6, temperature=1.0), vision=vision)
    rows = [p + g.output_ids for p, g in zip(prompts, gens)]
    ids, am = right_padded(rows)
    logp, _ = forward_logprobs(model, ids, am, temperature=1.0, vision=vision)
    for i, (p, g) in enumerate(zip(prompts, gens)):
        forced = logp[i, len(p) - 1: len(p) - 1 + len(g.output_ids)].tolist()
        assert max(abs(a - b) for a, b in zip(g.logprobs, forced)) < 1e-4, i
    black = _prompt((0, 0, 0), (56, 56))[1]
    other, _ = forward_logprobs(model, ids[:2], am[:2], temperature=1.0, vision=[red[1], black])
    assert (other[1] - logp[1]).abs().max() > 1e-4 and torch.equal(other[0], logp[0])


def test_the_qwen2_vl_processor_renders_and_expands_an_image_where_torchvision_imports():
    try:
        importlib.import_module("torchvision")
    except Exception as e:  # noqa: BLE001 - a torchvision built for another torch fails in many ways
        pytest.skip(f"Qwen2-VL's processor needs torchvision (its video processor imports it), which does not "
                    f"import here: {type(e).__name__}: {e}")
    from areal_trainer.model.builtin_vlm import build_tokenizer
    from areal_trainer.model.vision import VisionEncoder

    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                          "<|vision_end|>"]})
    template = ("{% for m in messages %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
                "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p['text'] }}{% endif %}{% endfor %}"
                "{% endfor %}")
    processor = transformers.Qwen2VLProcessor(image_processor=transformers.Qwen2VLImageProcessor(
        min_pixels=28 * 28, max_pixels=56 * 56), tokenizer=tok, chat_template=template)
    enc = VisionEncoder(processor, tok)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]}]
    ids, vision = enc.encode(msgs, [Image.new("RGB", (56, 56))])
    assert ids.count(enc.image_token_id) == 4 == enc.prompt_length(msgs, [(56, 56)]) - len(ids) + 4
    assert set(vision.tensors) == {"pixel_values", "image_grid_thw"}
