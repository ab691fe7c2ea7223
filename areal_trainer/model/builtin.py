"""Built-in models that need no download: a word-level tokenizer made in code and small Llama
models with random weights (``builtin:tiny`` ~1M parameters, ``builtin:small`` ~10M).

The tokenizer covers the built-in arithmetic task (``data/arith.py``): every word, number,
punctuation mark and ``####`` is one token, pieces after a space carry a leading ``▁`` (decoded
back to a space), and the chat template is ChatML-like. Both save and load like any Hugging Face checkpoint.

Tool-calling variants (``builtin:tiny-tools``, ``builtin:small-tools``): the same models with a tokenizer
that also covers the built-in task's calculator conversation (``data/arith.py``'s tool demonstrations).
Its extra tokens come after the whole default vocabulary, so every default id keeps its meaning; it
writes a number after a space as two tokens, ``▁`` and the number (see ``build_tokenizer``); the
tags ``<tool_call>``, ``<tools>`` and ``<tool_response>`` (and their closing tags) are single tokens.
Its chat template is Qwen2.5-like: the tools as a ``<tools>`` block in the system turn (each tool's name
and argument types, nothing else: descriptions are prose the word-level vocabulary does not cover),
assistant calls as hermes ``<tool_call>`` blocks (``rollout.tool_call_parser=hermes``), and tool results
as ``<tool_response>`` blocks in a user turn. Its end-of-sequence token is ``<|im_end|>``, the end of a
turn, so a sampled answer ends exactly where the template closes the assistant turn: re-rendering a
conversation reproduces the sampled ids, and an agent's calls concatenate (``rollout.agent_export=concat``).
"""

from __future__ import annotations

import json
import os

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
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
TOOLS_SUFFIX = "-tools"
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tools>", "</tools>", "<tool_response>", "</tool_response>"]
"""Single tokens of the tool-calling variant, split out of the text before pre-tokenization (not special:
decoding keeps them, so the tool-call parser sees them)."""
TOOL_PIECES = ["▁", "{", "}", "▁{", '"', '▁"', ":", ",", "name", "arguments", "expression", "calc", "string"]
"""The other pieces of the calculator conversation: the space before a number, hermes JSON and its words."""
TOOLS_CHAT_TEMPLATE = (
    # Chat templates render with trim_blocks (a newline right after a block tag is dropped): such
    # newlines are written as {{ '\n' }}.
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}<tools>"
    "{% for t in tools %}{% set f = t['function'] if t['function'] is defined else t %}"
    "{% set props = f['parameters']['properties'] if f['parameters'] is defined "
    "and f['parameters']['properties'] is defined else {} %}"
    "{{ '\\n{' }}\"name\": {{ f['name'] | tojson }}, \"arguments\": {{ '{' }}"
    "{% for k, v in props.items() %}{{ k | tojson }}: {{ (v['type'] if v['type'] is defined else 'any') | tojson }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}{{ '}}' }}{% endfor %}{{ '\\n' }}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and tools and loop.first %}"
    "{% elif m['role'] == 'assistant' and m['tool_calls'] is defined and m['tool_calls'] %}<|im_start|>assistant\n"
    "{% if m['content'] %}{{ m['content'] }}\n{% endif %}"
    "{% for c in m['tool_calls'] %}{% set f = c['function'] if c['function'] is defined else c %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}<tool_call>\n"
    "{{ {'name': f['name'], 'arguments': f['arguments']} | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Renders conversations without tools exactly as ``CHAT_TEMPLATE`` does."""
SIZES = {
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4),
    "small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=10, num_attention_heads=8),
}


def is_builtin(path: str) -> bool:
    return isinstance(path, str) and path.startswith("builtin:")


def has_tools(path: str) -> bool:
    """Whether ``path`` names a tool-calling variant (``builtin:<size>-tools``)."""
    return is_builtin(path) and path.endswith(TOOLS_SUFFIX)


def builtin_size(path: str) -> str:
    size = path.split(":", 1)[1].removesuffix(TOOLS_SUFFIX)
    if size not in SIZES:
        raise ValueError(f"unknown built-in model {path!r}; choose one of "
                         + ", ".join(f"builtin:{s}{v}" for v in ("", TOOLS_SUFFIX) for s in SIZES))
    return size


def build_tokenizer(path: str | None = None, extra: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """The word-level tokenizer of the built-in task (deterministic); of the tool-calling variant when
    ``path`` names one. ``extra``: more pieces, after every default id (the built-in VLM's picture words)."""
    tools = path is not None and has_tools(path)
    with open(VOCAB_FILE, encoding="utf-8") as f:
        words = json.load(f)
    if tools:
        words += TOOL_PIECES + TOOL_TAGS  # after every default id
    words += [w for w in extra if w not in words]
    vocab = {w: i for i, w in enumerate(words)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Spaces become a leading "▁" on the next piece; then words, numbers, "####" and single
    # punctuation marks (each with its "▁", if any) and newlines are separate tokens. The tool-calling
    # variant keeps a number apart from its "▁": a number is then one token wherever it stands (in a
    # sentence, after a quote, on its own line), so copying it into a call or from a tool result
    # is copying a token, which a small model learns much sooner than pairing two forms of each number.
    number = r"\d+" if tools else r"▁?\d+"
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
        pre_tokenizers.Split(Regex(rf"\n|▁?####|▁?[A-Za-z]+|{number}|▁?[^A-Za-z\d\s▁]|▁"), behavior="isolated"),
    ])
    tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    if tools:
        tk.add_tokens([AddedToken(t, normalized=False, special=False) for t in TOOL_TAGS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<|im_end|>" if tools else "<eos>",
        unk_token="<unk>", additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = TOOLS_CHAT_TEMPLATE if tools else CHAT_TEMPLATE
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
