"""How long a row may get: the row limit, the smaller of ``gconfig.max_tokens`` (AReaL's key: the most
tokens of prompt plus answer) and the model's positions (``max_position_embeddings`` of its config, else
the tokenizer's ``model_max_length`` when it is a real length). A model run past its positions gives
garbage (rotary models) or fails (learned position tables).

The dataset drops (or refuses) prompts that leave no room for an answer (``data/datasets.py``); the
rollout caps every answer to the room its prompt leaves (``rollout/limits.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len")
"""Where model configs keep their number of positions (Llama/Qwen/Mistral, GPT-2, others), in this order."""
SENSIBLE_MAX = 10**8
"""A tokenizer's ``model_max_length`` at or above this is transformers' "unknown" (1e30), not a length."""


@dataclass(frozen=True)
class Positions:
    """The number of positions of a model, and where it was read (for messages)."""

    count: int
    source: str
    """E.g. ``max_position_embeddings=512 of actor.path='builtin:tiny'``."""


@dataclass(frozen=True)
class RowLimit:
    """The most tokens of prompt plus answer of a row, and which setting binds it (for messages)."""

    tokens: int
    source: str
    """E.g. ``gconfig.max_tokens=64``, or the model's :attr:`Positions.source`."""
    fix: str
    """How to raise it: ``raise gconfig.max_tokens``, or use a model with more positions."""

    @classmethod
    def of(cls, gconfig: Any, key: str, positions: Positions | None) -> RowLimit:
        """The limit of rows sampled with ``gconfig`` (config key ``key``) from a model with ``positions``."""
        if positions is not None and positions.count < gconfig.max_tokens:
            return cls(positions.count, positions.source, "use a model with more positions")
        return cls(int(gconfig.max_tokens), f"{key}.max_tokens={gconfig.max_tokens}", f"raise {key}.max_tokens")


def model_positions(config: Any, tokenizer: Any = None, where: str = "the model") -> Positions | None:
    """The positions of a model from its config (the text model's, for a multimodal config), else from the
    tokenizer's ``model_max_length`` when it is a real length; None when neither says."""
    if config is not None:
        try:
            text = config.get_text_config()
        except (AttributeError, ValueError):  # not a transformers config, or one with several text models
            text = config
        for name in POSITION_KEYS:
            n = getattr(text, name, None)
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
                return Positions(n, f"{name}={n} of {where}")
    n = getattr(tokenizer, "model_max_length", None)
    if isinstance(n, int) and not isinstance(n, bool) and 1 <= n < SENSIBLE_MAX:
        return Positions(n, f"the tokenizer's model_max_length={n} of {where}")
    return None


def row_tokens(gconfig: Any, positions: int | None) -> int:
    """The row limit: ``gconfig.max_tokens`` or ``positions`` (the model's), the smaller."""
    return int(gconfig.max_tokens) if positions is None else min(int(gconfig.max_tokens), int(positions))
