"""How long a row may get: a prompt plus its answer stay within the row limit, the smaller of
``gconfig.max_tokens`` (AReaL's key: the most tokens of prompt plus answer) and the model's positions
(``max_position_embeddings`` of its config, else the tokenizer's ``model_max_length`` when it is a real
length). A model run past its positions gives garbage (rotary models) or fails (learned position tables).

Two places hold the limit. When a dataset is built (``data/datasets.py``), a prompt that leaves no room
for even one answer token is dropped or is an error (``train_dataset.overlong_prompts``). When answers are
sampled, every row's budget is ``min(gconfig.max_new_tokens, limit - prompt tokens)``
(:func:`new_token_caps`): the engines sample at most that many tokens and the workflows cut any answer
longer than its cap (:func:`capped`), so prompt + answer never exceed the limit whatever the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UserError
from ..model.limits import Positions, RowLimit, model_positions, row_tokens
from .types import Generation

__all__ = ["Positions", "RowLimit", "capped", "engine_positions", "model_positions", "new_token_caps",
           "positions_of", "row_tokens"]

def new_token_caps(prompt_lens: Sequence[int], gconfig: Any, positions: int | None) -> list[int]:
    """The most new tokens of each row: ``min(gconfig.max_new_tokens, limit - prompt tokens)``, where the
    limit is ``gconfig.max_tokens`` or ``positions`` (the model's), the smaller. A prompt with no room for
    one new token is a :class:`UserError` (datasets drop such prompts when they are built)."""
    limit = row_tokens(gconfig, positions)
    caps = [min(int(gconfig.max_new_tokens), limit - int(n)) for n in prompt_lens]
    full = next((i for i, c in enumerate(caps) if c < 1), None)
    if full is not None:
        which = f"max_tokens={limit}" if limit == gconfig.max_tokens else f"the model's {positions} positions"
        raise UserError(f"a prompt of {prompt_lens[full]} tokens leaves no room for an answer within the row limit "
                        f"of {limit} tokens ({which}). Datasets drop such prompts when they are built "
                        "(train_dataset.overlong_prompts); a workflow must not build longer ones.")
    return caps


def capped(gens: Sequence[Generation], caps: Sequence[int]) -> list[Generation]:
    """Each answer cut to its cap and then marked truncated (the built-in engines never exceed a cap; this
    holds the limit for any engine)."""
    return [g if len(g.output_ids) <= c else Generation(list(g.output_ids[:c]), list(g.logprobs[:c]), True,
                                                        list(g.versions[:c]))
            for g, c in zip(gens, caps)]


def positions_of(model: Any, tokenizer: Any, most: int | None = None) -> int | None:
    """The positions of ``model`` (a module with a ``config``; :func:`model_positions`), at most ``most``."""
    found = model_positions(getattr(model, "config", None), tokenizer)
    counts = [n for n in (found.count if found else None, most) if isinstance(n, int) and n >= 1]
    return min(counts) if counts else None


def engine_positions(engine: Any) -> int | None:
    """The positions of the model an engine samples from (``max_positions``; None when it does not say)."""
    return getattr(engine, "max_positions", None)
