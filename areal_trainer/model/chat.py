"""Chat prompts as token ids: rendered by the tokenizer's chat template, ending with the assistant turn's
opening, exactly as the engines receive them (the datasets count prompt lengths the same way)."""

from __future__ import annotations

import json
from typing import Any


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat prompt, ending with the assistant turn's opening."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def prompt_lengths(tokenizer, conversations: list[list[dict]]) -> list[int]:
    """``len(prompt_ids(tokenizer, m))`` of each conversation ``m``, rendered and tokenized as one batch."""
    if not conversations:
        return []
    texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids]


def unknown_pieces(tokenizer, text: str) -> list[str]:
    """The words of ``text`` that ``tokenizer`` maps to its unknown token (adjacent unknown tokens joined,
    surrounding spaces stripped), in order; none for a tokenizer without an unknown token."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return []
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans: list[list[int]] = []
    for token, (start, end) in zip(enc.input_ids, enc.offset_mapping):
        if token != unk:
            continue
        if spans and spans[-1][1] == start:
            spans[-1][1] = end
        else:
            spans.append([start, end])
    return [w for start, end in spans if (w := text[start:end].strip())]


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A request message as chat templates expect it: tool-call arguments as objects, not JSON text."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        fn = dict(c.get("function", {}))
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"] or "{}")
            except json.JSONDecodeError:
                pass  # rendered as the model wrote it
        calls.append({**c, "function": fn})
    return {**m, "tool_calls": calls}
