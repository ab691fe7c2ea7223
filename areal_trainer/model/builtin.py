"""Built-in models that need no download: a word-level tokenizer made in code and small Llama
models with random weights (``builtin:tiny`` ~1M parameters, ``builtin:small`` ~10M).

The tokenizer covers the built-in arithmetic task (``data/arith.py``): every word, number,
punctuation mark and ``####`` is one token, pieces after a space carry a leading ``▁`` (decoded
back to a space), and the chat template is ChatML-like. Both save and load like any Hugging Face checkpoint.
"""

from __future__ import annotations

import json
import os

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_FILE = os.path.join(os.path.dirname(__file__), "builtin_vocab.json")
"""The built-in tokenizer's vocabulary, in id order: the special tokens, then every piece of the
built-in task's text (``data/arith.py``; ``tests/unit/test_model_io.py`` checks it is exactly what a
word-level tokenizer trained on that text learns)."""

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SIZES = {
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4),
    "small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=10, num_attention_heads=8),
}


def is_builtin(path: str) -> bool:
    return isinstance(path, str) and path.startswith("builtin:")


def builtin_size(path: str) -> str:
    size = path.split(":", 1)[1]
    if size not in SIZES:
        raise ValueError(f"unknown built-in model {path!r}; choose one of "
                         + ", ".join(f"builtin:{s}" for s in SIZES))
    return size


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The word-level tokenizer of the built-in task (deterministic)."""
    with open(VOCAB_FILE, encoding="utf-8") as f:
        vocab = {w: i for i, w in enumerate(json.load(f))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Spaces become a leading "▁" on the next piece; then words, numbers, "####" and single
    # punctuation marks (each with its "▁", if any) and newlines are separate tokens.
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
        pre_tokenizers.Split(Regex(r"\n|▁?####|▁?[A-Za-z]+|▁?\d+|▁?[^A-Za-z\d\s▁]|▁"), behavior="isolated"),
    ])
    tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_config(path: str, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    """The config of the named built-in size (no weights)."""
    dims = SIZES[builtin_size(path)]
    return LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=512, tie_word_embeddings=True,
        num_key_value_heads=dims["num_attention_heads"], pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **dims,
    )


def build_model(path: str, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    """A randomly initialised Llama of the named built-in size (weights depend only on ``seed``)."""
    cfg = build_config(path, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg)
