"""The built-in vision-language model (``builtin:tiny-vlm``): a LLaVA made in code with random weights, for
tests and offline runs; no download.

* the language model is the ``builtin:tiny`` Llama (``model/builtin.py``), the vision tower a CLIP vision
  encoder of 16x16-pixel images in 4x4 patches (16 image features per image, the CLS feature dropped as
  LLaVA's ``default`` strategy does), joined by LLaVA's two-layer projector;
* the tokenizer is the built-in one with the words of the picture questions (colours, shapes, counts) after
  the whole default vocabulary, so every default id keeps its meaning, and ``<image>``, the image
  placeholder, as the last token;
* the processor is ``LlavaProcessor`` with a PIL CLIP image processor (no torchvision needed): it resizes
  every image to 16x16 and writes each ``<image>`` of a prompt as 16 image tokens;
* the chat template is the built-in ChatML-like one, whose message content may be text or a list of parts
  (``{"type": "image"}`` writes ``<image>``, ``{"type": "text", "text": ...}`` the text): TRL's layout.
"""

from __future__ import annotations

import torch

from . import builtin

VLM_SUFFIX = "-vlm"
IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH_SIZE = 16, 4
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
PICTURE_WORDS = [
    "What", "Which", "How", "Answer", "▁Answer", "▁colour", "▁color", "▁shape", "▁is", "▁the", "▁this", "▁square",
    "▁squares", "▁circle", "▁circles", "▁triangle", "▁picture", "▁image", "▁many", "▁are", "▁there", "▁with", "▁one",
    "▁word", "▁in", "▁and", "▁of", "▁or", "▁first", "▁second", "▁same", "▁yes", "▁no", "yes", "no", ":",
    *[w for c in ("red", "green", "blue", "yellow", "white", "black", "orange", "purple") for w in (c, "▁" + c)],
]
"""The words of the picture questions and answers, as pieces of the built-in word-level tokenizer."""
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def is_builtin_vlm(path: str) -> bool:
    return builtin.is_builtin(path) and path.endswith(VLM_SUFFIX)


def _text_path(path: str) -> str:
    return path.removesuffix(VLM_SUFFIX)


def build_tokenizer(path: str = "builtin:tiny-vlm"):
    """The built-in word-level tokenizer with the picture words and ``<image>`` (deterministic)."""
    from tokenizers import AddedToken

    tok = builtin.build_tokenizer(_text_path(path), extra=tuple(PICTURE_WORDS))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>",
                                                          AddedToken(IMAGE_TOKEN, normalized=False, special=True)]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_processor(tokenizer):
    """``LlavaProcessor`` of the built-in VLM around ``tokenizer`` (16x16 images, 16 image tokens each)."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    images = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE,
                                                                                   "width": IMAGE_SIZE})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          image_token=IMAGE_TOKEN, chat_template=CHAT_TEMPLATE)


def build_config(path: str, tokenizer):
    """The LLaVA config of the named built-in VLM (no weights)."""
    from transformers import CLIPVisionConfig, LlavaConfig

    text = builtin.build_config(_text_path(path), tokenizer)
    vision = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, **VISION)
    return LlavaConfig(text_config=text, vision_config=vision, image_token_id=tokenizer.convert_tokens_to_ids(
        IMAGE_TOKEN), vision_feature_layer=-1, vision_feature_select_strategy="default", projector_hidden_act="gelu",
        tie_word_embeddings=True)


def build_model(path: str, tokenizer, seed: int):
    """A randomly initialised built-in VLM (weights depend only on ``seed``)."""
    from transformers import LlavaForConditionalGeneration

    cfg = build_config(path, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlavaForConditionalGeneration(cfg)
