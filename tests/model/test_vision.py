"""The built-in VLM (``builtin:tiny-vlm``) and the training-side forward on image rows (``model/vision.py``): the
tokenizer keeps every default id, the processor expands an image to 16 tokens, packed image rows equal the
padded batch and each row alone, the images reach the log-probs, the vision tower is frozen by default, LoRA
adapts the language model only, and the critic's values see the images too."""

import torch
from PIL import Image

from areal_trainer.config.schema import PPOActorConfig
from areal_trainer.model import builtin, builtin_vlm, lora
from areal_trainer.model.critic import ValueModel
from areal_trainer.model.packing import supports_packing
from areal_trainer.model.vision import VisionEncoder, collate, freeze_vision, is_vlm, vision_tower
from areal_trainer.train.models.logprobs import forward_logprobs

TOK = builtin_vlm.build_tokenizer()
ENC = VisionEncoder(builtin_vlm.build_processor(TOK), TOK)
Q = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]}]
COLOURS = [(220, 30, 30), (30, 170, 40), (30, 60, 220)]


def _model(seed=0):
    return builtin_vlm.build_model("builtin:tiny-vlm", TOK, seed).eval()


def _rows(answers=((5, 6, 7), (8, 9), (10, 11, 12, 13))):
    """Three image rows (one colour each) and a text row, right-padded; each row's images."""
    prompts, vision = [], []
    for colour in COLOURS:
        ids, v = ENC.encode(Q, [Image.new("RGB", (16, 16), colour)])
        prompts.append(ids)
        vision.append(v)
    prompts.append(ENC.encode([{"role": "user", "content": "How many apples?"}], [])[0])
    vision.append(None)
    rows = [p + list(a) for p, a in zip(prompts, [*answers, (14, 15)])]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], am[i, :len(r)] = torch.tensor(r), 1
    return ids, am, vision


def test_the_tokenizer_keeps_every_default_id_and_adds_the_picture_words_and_image_token():
    text = builtin.build_tokenizer().get_vocab()
    vocab = TOK.get_vocab()
    assert all(vocab[w] == i for w, i in text.items())
    assert vocab["<image>"] == len(vocab) - 1 and {"▁colour", "red", "▁square"} <= vocab.keys()
    ids, v = ENC.encode(Q, [Image.new("RGB", (40, 30))])
    assert ids.count(vocab["<image>"]) == 16 and v.tensors["pixel_values"].shape == (1, 3, 16, 16)
    assert TOK.decode(ids, skip_special_tokens=True).strip().startswith("user\nWhat colour is the square?")


def test_packed_image_rows_equal_the_padded_batch_and_each_row_alone():
    model = _model()
    assert supports_packing(model.base_model)  # the default forward packs them
    ids, am, vision = _rows()
    packed, _ = forward_logprobs(model, ids, am, temperature=1.0, vision=vision)
    padded, _ = forward_logprobs(model, ids, am, temperature=1.0, vision=vision, packing=False)
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    for r in range(len(vision)):
        n = int(am[r].sum())
        alone, _ = forward_logprobs(model, ids[r:r + 1, :n], am[r:r + 1, :n], temperature=1.0, vision=[vision[r]])
        torch.testing.assert_close(packed[r, :n], alone[0], rtol=0, atol=1e-5)


def test_the_images_reach_the_log_probs():
    model = _model()
    ids, am, vision = _rows(answers=((5, 6), (5, 6), (5, 6)))  # the same tokens on three pictures
    logp, _ = forward_logprobs(model, ids, am, temperature=1.0, vision=vision)
    swapped, _ = forward_logprobs(model, ids, am, temperature=1.0, vision=[vision[1], vision[0], *vision[2:]])
    assert (logp[0] - logp[1]).abs().max() > 1e-3  # other pictures, other log-probs
    torch.testing.assert_close(swapped[0], logp[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(swapped[2:], logp[2:], rtol=0, atol=1e-5)


def test_collate_keeps_row_order_and_skips_text_rows():
    _, _, vision = _rows()
    pixels = collate([vision[2], None, vision[0]])["pixel_values"]
    want = torch.cat([vision[2].tensors["pixel_values"], vision[0].tensors["pixel_values"]])
    torch.testing.assert_close(pixels, want)
    assert collate([None, None]) == {}


def test_the_vision_tower_is_frozen_and_the_projector_and_language_model_train():
    model = _model()
    assert is_vlm(model) and not is_vlm(builtin.build_model("builtin:tiny", builtin.build_tokenizer(), 0))
    tower = vision_tower(model)
    assert freeze_vision(model) == sum(p.numel() for p in tower.parameters())
    ids, am, vision = _rows()
    logp, _ = forward_logprobs(model, ids, am, temperature=1.0, vision=vision)
    logp.sum().backward()
    assert all(p.grad is None for p in tower.parameters())
    assert all(p.grad is not None for p in model.model.multi_modal_projector.parameters())
    assert model.model.language_model.layers[0].self_attn.q_proj.weight.grad is not None


def test_lora_adapts_the_language_model_only():
    model = _model()
    cfg = PPOActorConfig(path="builtin:tiny-vlm", use_lora=True)
    peft = lora.attach(model, cfg, seed=0)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in peft.named_parameters() if ".lora_A" in n}
    assert adapted and all(".language_model." in n for n in adapted)
    assert any(n.endswith("q_proj") for n in adapted) and any(n.endswith("down_proj") for n in adapted)
    assert not any("vision_tower" in n or "multi_modal_projector" in n for n in adapted)


def test_the_critic_sees_the_images():
    critic = ValueModel.from_causal_lm(_model())
    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(0))
    ids, am, vision = _rows(answers=((5, 6), (5, 6), (5, 6)))
    values = critic(ids, am, vision=vision)
    padded = critic(ids, am, vision=vision, packing=False)
    torch.testing.assert_close(values, padded, rtol=1e-5, atol=1e-5)  # values of order 1-10: float32 sums
    assert (values[0] - values[1]).abs().max() > 1e-4
