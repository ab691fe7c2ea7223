"""Chat prompts as token ids: rendered by the tokenizer's chat template, ending with the assistant turn's
opening, exactly as the engines receive them (the datasets count prompt lengths the same way)."""

from __future__ import annotations


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
