"""An episode's recorded calls as training rows, and its rewards per call.

Rewards (AReaL's ``turn_discount``). An episode's reward goes to its last call; per-call rewards set
with ``set_reward`` (or returned as ``{completion_id: reward}``) go to their calls, and a call without
one has 0. Then, from the newest call back, each call adds the discounted reward of the call after
it: ``r_i <- r_i + turn_discount * r_{i+1}``, so every call's reward is the discounted return from it.

Rows (``rollout.agent_export``):

* ``individual`` (default): each call is its own row, ``prompt | answer``, trained with its own
  discounted return.
* ``concat``: consecutive calls share one row when the next call's prompt ids begin with exactly the
  previous call's prompt and output ids; the row is then ``prompt | answer 0 | env 1 | answer 1 | ...``,
  where the environment's tokens (the end of the turn, tool results, user messages, the next turn's
  opening) are not trained (``loss_mask`` 0, ``turn_ids`` -1). A call whose prompt does not extend
  the row (with ``rollout.chat_template_type=hf``: a chat template that drops earlier reasoning or closes
  a turn with another token than the model's stop token; an agent that edits its history; a parallel
  sibling choice of ``n > 1``) starts a new row instead; ``fallbacks`` counts how often that happened
  to a call's first choice. A call joins the newest row it extends, so an agent that continues one of
  several choices continues that choice's row. A row's reward is the
  discounted return of its first call. A call with images joins a row only when its images are the row's
  (the same pictures: image tokens are the same ids for any picture); the row's images are its last call's.

Nothing here re-tokenizes anything: rows are the recorded ids, so the ids trained are the ids sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..rows import Segment
from .session import CallRecord

EXPORTS = ("individual", "concat")


def discounted_rewards(rewards: Sequence[float | None], turn_discount: float) -> list[float]:
    """Per-call rewards (None: 0), in call order, as discounted returns (see the module docstring)."""
    out = [0.0 if r is None else float(r) for r in rewards]
    for i in range(len(out) - 2, -1, -1):
        out[i] += turn_discount * out[i + 1]
    return out


@dataclass
class ExportedRow:
    """One training row of an episode: its segments, reward, whether its last answer was cut, and
    how many calls it holds."""

    segments: list[Segment]
    reward: float
    truncated: bool
    calls: int
    vision: Any = None
    """The images of the row's prompt (those of its last call), None for a text row."""


def _answer(rec: CallRecord, turn: int) -> Segment:
    return Segment(list(rec.output_ids), True, list(rec.logprobs), list(rec.versions), turn)


def same_images(a: Any, b: Any) -> bool:
    """Whether two prompts' processed images are the same pictures (image tokens alone cannot tell: every image's
    tokens are the same placeholder ids), so that a call may continue the other's row."""
    if a is None or b is None:
        return a is b
    return a is b or (a.n_images == b.n_images and a.tensors.keys() == b.tensors.keys()
                      and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors))


def export_rows(records: Sequence[CallRecord], returns: Sequence[float], mode: str) -> tuple[list[ExportedRow], int]:
    """The rows of one episode's calls (in call order, with their discounted ``returns``), and how many
    calls could not be merged (``concat`` only; always 0 for ``individual``)."""
    if mode not in EXPORTS:
        raise ValueError(f"unknown export {mode!r}; one of {EXPORTS}")
    rows: list[ExportedRow] = []
    contexts: list[list[int]] = []  # each row's tokens so far
    fallbacks = 0
    for rec, ret in zip(records, returns):
        prompt = list(rec.prompt_ids)
        home = None
        if mode == "concat":  # the newest row this call's prompt extends exactly, with the same images
            home = next((k for k in range(len(rows) - 1, -1, -1)
                         if len(prompt) >= len(contexts[k]) and prompt[:len(contexts[k])] == contexts[k]
                         and same_images(rows[k].vision, rec.vision)), None)
            fallbacks += home is None and rec.index == 0 and bool(rows)
        if home is None:
            rows.append(ExportedRow([Segment(prompt), _answer(rec, 0)], float(ret), rec.truncated, 1, rec.vision))
            contexts.append(prompt + list(rec.output_ids))
            continue
        row = rows[home]
        env = prompt[len(contexts[home]):]
        if env:
            row.segments.append(Segment(env))
        row.segments.append(_answer(rec, row.calls))
        row.calls += 1
        row.truncated, row.vision = rec.truncated, rec.vision
        contexts[home] = prompt + list(rec.output_ids)
    return rows, fallbacks
