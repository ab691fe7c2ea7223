"""Words of the prompts that a tokenizer cannot spell: the pieces it maps to its unknown token.

A word-level tokenizer (the built-in one, ``model/builtin.py``) knows a fixed list of words; any other
word of a prompt reaches the model as ``<unk>``, the same token for every such word, so the model cannot
read it. :func:`unknown_words` finds them in the samples' messages (what the chat template renders, less
the template's own markup), for one warning before any model loads. Tokenizers without an unknown token,
or whose vocabulary covers every byte, never produce one, and then nothing is reported.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ..model.chat import unknown_pieces

SHOWN = 10
"""How many of the unknown words a warning names, the most frequent first."""


@dataclass(frozen=True)
class UnknownWords:
    """The unknown words of one dataset's prompts."""

    counts: Counter
    """Each unknown word (adjacent unknown pieces joined, spaces stripped) with the number of prompts it is in."""
    prompts: int
    """How many prompts contain one."""
    total: int
    """How many prompts were read."""

    def most_common(self, n: int = SHOWN) -> list[str]:
        """The ``n`` most frequent unknown words (ties in the order they were first met)."""
        return [w for w, _ in self.counts.most_common(n)]


CHUNK = re.compile(r"\s*\S+")
"""A word with the spaces before it: texts are checked chunk by chunk, each distinct chunk tokenized once
(cheap even for 50000 prompts). Tokenizers split at spaces, so a chunk's pieces are those it has in place."""


def _texts(content) -> list[str]:
    """A message content's texts: the text itself, or the text parts of a list of parts (TRL's vision layout)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


def unknown_words(tokenizer, samples: list[dict]) -> UnknownWords | None:
    """The pieces of the samples' message texts that ``tokenizer`` maps to its unknown token, or None when
    there are none (or the tokenizer has no unknown token)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not samples:
        return None
    chunks_of = [{c for m in s["messages"] for text in _texts(m.get("content")) for c in CHUNK.findall(text)}
                 for s in samples]
    distinct = sorted(set().union(*chunks_of))
    if not distinct:
        return None
    ids = tokenizer(distinct, add_special_tokens=False).input_ids
    words_of = {c: unknown_pieces(tokenizer, c) for c, row in zip(distinct, ids) if unk in row}
    if not words_of:
        return None
    counts: Counter = Counter()
    prompts = 0
    for chunks in chunks_of:
        words = [w for c in sorted(chunks & words_of.keys()) for w in words_of[c]]
        prompts += bool(words)
        counts.update(words)
    return UnknownWords(counts, prompts, len(samples))


def unknown_words_warning(found: dict[str, UnknownWords], tokenizer_key: str, tokenizer_path: str) -> str:
    """One warning for the datasets in ``found`` (by key): the words, how many prompts, and what to do."""
    counts: Counter = Counter()
    for words in found.values():
        counts.update(words.counts)
    shown = ", ".join(repr(w) for w, _ in counts.most_common(SHOWN))
    more = f" (the {SHOWN} most frequent of {len(counts)})" if len(counts) > SHOWN else ""
    where = " and ".join(f"{w.prompts} of the {w.total} prompts of {key}" for key, w in found.items())
    also = " and tokenizer_path=null" if tokenizer_key == "tokenizer_path" else ""
    return (f"the tokenizer of {tokenizer_key}={tokenizer_path!r} cannot spell words of {where}: they reach the model "
            f"as its unknown token, the same for every such word. Unknown words: {shown}{more}. Use a pretrained "
            f"model with its own tokenizer: actor.path=<model>{also} (e.g. "
            "actor.path=HuggingFaceTB/SmolLM2-135M-Instruct, or actor.path=smollm2 for the packaged offline copy).")
