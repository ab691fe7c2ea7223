"""Assemble a small vision-language model offline: SmolLM2-135M-Instruct (the packaged ``smollm2``) as the
language model, a small CLIP vision encoder with random weights (32x32-pixel images in 8x8 patches: 16 image
tokens per image) and LLaVA's projector, saved as a LLaVA checkpoint with its processor::

    python -m examples.vlm.assemble data/smollm2-vlm

The language model keeps SmolLM2's weights (its vocabulary grows by one token, ``<image>``); the vision
encoder and the projector start random, so the model cannot see yet: the supervised warm start trains the
projector (the vision encoder stays frozen, ``actor.freeze_vision``), then RL. The chat template is SmolLM2's
ChatML, whose message content may also be a list of text and image parts (TRL's layout).
"""

from __future__ import annotations

import argparse

import torch

IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH_SIZE = 32, 8
VISION = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n" + SYSTEM
    + "<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def assemble(out_dir: str, seed: int = 0) -> str:
    """Write the assembled model and its processor to ``out_dir``; returns it."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from areal_trainer.model import smollm2

    source = smollm2.ensure_checkpoint("examples/vlm")
    tok = AutoTokenizer.from_pretrained(source)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    lm = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    lm.resize_token_embeddings(len(tok), mean_resizing=False)
    text = lm.config
    text.vocab_size = len(tok)
    config = LlavaConfig(text_config=text, vision_config=CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=PATCH_SIZE,
                                                                          **VISION),
                         image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN), vision_feature_layer=-1,
                         vision_feature_select_strategy="default", projector_hidden_act="gelu",
                         tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vlm = LlavaForConditionalGeneration(config)
    vlm.model.language_model.load_state_dict(lm.model.state_dict())
    vlm.lm_head.weight = vlm.model.language_model.embed_tokens.weight
    images = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=PATCH_SIZE,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               image_token=IMAGE_TOKEN, chat_template=CHAT_TEMPLATE)
    vlm.generation_config.eos_token_id = tok.eos_token_id
    vlm.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    print(assemble(**vars(parser.parse_args())))
