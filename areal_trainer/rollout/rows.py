"""The one trajectory type: :class:`Rows`, one group's rows as tensors, built from sampled segments.

A row is a sequence of :class:`Segment`\\ s: prompt, user or tool tokens (not trained) and model output
(trained; each token with the behaviour log-prob and the policy version that sampled it). ``Rows`` holds
a group's ``G`` rows right-padded and token-aligned (``[G, L]``), with their per-row values (``[G]``).
Its fields are the one definition of the row keys: each field says whether it is per token or per row,
whether every group has it, and what pads it.

Every built-in workflow and agent builds its rows with :meth:`Rows.from_segments`; a user's workflow may
return a plain dict of the same tensors instead, which :meth:`Rows.from_tensors` checks and wraps (keys
that are not fields are not trained on and are dropped). :func:`concat_rows` pads the groups of a step to
the widest row and stacks them into the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch

from ..errors import PluginOutputError


class Segment(NamedTuple):
    """A contiguous piece of a trajectory row.

    A trainable segment is model output: ``logprobs`` and ``versions`` give each token's behaviour
    log-probability and policy version, ``turn_id`` its assistant turn (0, 1, ...). The others
    (prompt, user or tool tokens) have ``logprobs = versions = None`` and ``turn_id = -1``.
    """

    tokens: list[int]
    trainable: bool = False
    logprobs: list[float] | None = None
    versions: list[int] | None = None
    turn_id: int = -1


def _per_token(pad: float, *, optional: bool = False) -> Any:
    meta = {"per": "token", "pad": pad}
    return field(default=None, metadata=meta) if optional else field(metadata=meta)


def _per_row(*, fill: float | None = None) -> Any:
    meta = {"per": "row", "pad": fill}
    return field(default=None, metadata=meta) if fill is not None else field(metadata=meta)


@dataclass(frozen=True)
class Rows:
    """One group's ``G`` rows. Token-aligned, right-padded ``[G, L]`` fields are padded with their ``pad``
    (``-1`` marks "off model output" for ``turn_ids`` and ``versions``); per-row fields are ``[G]``.
    ``token_rewards`` and ``num_turns`` are optional: a batch where some groups lack them gets their pad
    (no process reward; one turn)."""

    input_ids: torch.Tensor = _per_token(0)
    """``[G, L]`` int64 token ids."""
    attention_mask: torch.Tensor = _per_token(0)
    """``[G, L]`` int64: 1 on the row's tokens, 0 on padding."""
    loss_mask: torch.Tensor = _per_token(0.0)
    """``[G, L]`` float32: 1 on model output (trained), 0 elsewhere."""
    logprobs: torch.Tensor = _per_token(0.0)
    """``[G, L]`` float32: each sampled token's behaviour log-probability, 0 elsewhere."""
    turn_ids: torch.Tensor = _per_token(-1)
    """``[G, L]`` int32: the assistant turn (0, 1, ...) of each sampled token, -1 elsewhere."""
    versions: torch.Tensor = _per_token(-1)
    """``[G, L]`` int32: the policy version that sampled each token, -1 elsewhere."""
    rewards: torch.Tensor = _per_row()
    """``[G]`` float32: each row's reward."""
    is_truncated: torch.Tensor = _per_row()
    """``[G]`` bool: the row's answer hit its length limit without a stop token."""
    token_rewards: torch.Tensor | None = _per_token(0.0, optional=True)
    """``[G, L]`` float32 process rewards, or None."""
    num_turns: torch.Tensor | None = _per_row(fill=1.0)
    """``[G]`` float32: the assistant turns of each row, or None."""

    @classmethod
    def from_segments(cls, rows: Sequence[Sequence[Segment]], *, rewards: Sequence[float],
                      truncated: Sequence[bool], num_turns: Sequence[float] | None = None) -> Rows:
        """The rows ``rows[i]`` (each its segments in order), with their rewards, truncation flags and
        (optionally) turn counts."""
        n = len(rows)
        if len(rewards) != n or len(truncated) != n or num_turns is not None and len(num_turns) != n:
            raise ValueError(f"{n} rows need {n} rewards, truncation flags and turn counts; got {len(rewards)}, "
                             f"{len(truncated)} and {None if num_turns is None else len(num_turns)}")
        return cls(**stack_rows([make_row(r) for r in rows]),
                   rewards=torch.tensor([float(r) for r in rewards], dtype=torch.float32),
                   is_truncated=torch.tensor([bool(t) for t in truncated], dtype=torch.bool),
                   num_turns=None if num_turns is None else torch.tensor([float(x) for x in num_turns]))

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Any], label: str = "a trajectory group") -> Rows:
        """A workflow's dict of row tensors, checked (:func:`tensor_problems`) and wrapped."""
        problems = tensor_problems(tensors, label)
        if problems:
            raise PluginOutputError("; ".join(problems))
        return cls(**{k: tensors[k] for k in KEYS if k in tensors})

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The fields that are set, by name."""
        return {k: v for k in KEYS if (v := getattr(self, k)) is not None}

    @property
    def n_rows(self) -> int:
        return int(self.input_ids.shape[0])


_FIELDS = fields(Rows)
KEYS = tuple(f.name for f in _FIELDS)
"""Every row key, in the order of :class:`Rows`."""
TOKEN_KEYS = tuple(f.name for f in _FIELDS if f.metadata["per"] == "token")
"""The token-aligned ``[G, L]`` keys."""
ROW_KEYS = tuple(f.name for f in _FIELDS if f.metadata["per"] == "token" and f.default is not None)
"""The token-aligned ``[G, L]`` tensors every group has."""
ROW_VALUE_KEYS = tuple(f.name for f in _FIELDS if f.metadata["per"] == "row" and f.default is not None)
"""The per-row ``[G]`` tensors every group has."""
PAD_VALUES = {f.name: f.metadata["pad"] for f in _FIELDS if f.metadata["pad"] is not None}
"""What pads each token-aligned key, and fills an optional per-row key a group lacks."""


def tensor_problems(tensors: Mapping[str, Any], label: str) -> list[str]:
    """What is wrong with ``tensors`` as one group's rows (empty when they are well formed)."""
    missing = [k for k in (*ROW_KEYS, *ROW_VALUE_KEYS) if k not in tensors]
    if missing:
        return [f"{label}: a trajectory group lacks {', '.join(missing)}."]
    wrong = [k for k in KEYS if k in tensors and not isinstance(tensors[k], torch.Tensor)]
    if wrong:
        return [f"{label}: {', '.join(wrong)} must be torch tensors; got "
                f"{', '.join(type(tensors[k]).__name__ for k in wrong)}."]
    shape = tuple(tensors["input_ids"].shape)
    if len(shape) != 2:
        return [f"{label}: input_ids must be [G, L]; got {shape}."]
    p = [f"{label}: {k} has shape {tuple(tensors[k].shape)}; expected {shape} like input_ids."
         for k in TOKEN_KEYS if k in tensors and tuple(tensors[k].shape) != shape]
    p += [f"{label}: {k} has shape {tuple(tensors[k].shape)}; expected ({shape[0]},), one value per row."
          for k in KEYS if k not in TOKEN_KEYS and k in tensors and tuple(tensors[k].shape) != (shape[0],)]
    return p


def make_row(segments: Sequence[Segment]) -> dict[str, torch.Tensor]:
    """One row's token-aligned tensors from its segments in order (1-D, by :data:`ROW_KEYS`).

    Trainable segments are model outputs (loss_mask 1, their turn id, behaviour logprobs and policy
    versions); the others are prompt, user or tool tokens (loss_mask 0, turn id -1, logprob 0,
    version -1).
    """
    ids, lmask, logps, turns, versions = [], [], [], [], []
    for seg in segments:
        seg = Segment(*seg)
        n = len(seg.tokens)
        ids += seg.tokens
        lmask += [1.0 if seg.trainable else 0.0] * n
        if seg.trainable:
            if seg.logprobs is None or seg.versions is None or len(seg.logprobs) != n or len(seg.versions) != n:
                raise ValueError(f"a trainable segment of {n} tokens needs {n} logprobs and {n} versions")
            logps += seg.logprobs
            versions += seg.versions
            turns += [seg.turn_id] * n
        else:
            logps += [0.0] * n
            versions += [-1] * n
            turns += [-1] * n
    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "attention_mask": torch.ones(len(ids), dtype=torch.long),
        "loss_mask": torch.tensor(lmask, dtype=torch.float32),
        "logprobs": torch.tensor(logps, dtype=torch.float32),
        "turn_ids": torch.tensor(turns, dtype=torch.int32),
        "versions": torch.tensor(versions, dtype=torch.int32),
    }


def stack_rows(rows: list[dict[str, torch.Tensor]], width: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad 1-D rows to ``width`` (default: the longest) and stack them into ``[N, width]``."""
    width = width or max(len(r["input_ids"]) for r in rows)
    out = {}
    for key in rows[0]:
        t = torch.full((len(rows), width), PAD_VALUES.get(key, 0), dtype=rows[0][key].dtype)
        for i, r in enumerate(rows):
            t[i, : len(r[key])] = r[key]
        out[key] = t
    return out


def concat_rows(parts: Sequence[Rows]) -> Rows:
    """The groups' rows in order as one ``[B, S]`` batch, token-aligned fields padded to the widest row. An
    optional field that some groups have is filled with its pad in the others."""
    width = max(p.input_ids.shape[1] for p in parts)
    out: dict[str, torch.Tensor] = {}
    for f in _FIELDS:
        values = [getattr(p, f.name) for p in parts]
        have = next((v for v in values if v is not None), None)
        if have is None:
            continue
        pad = f.metadata["pad"]
        if f.metadata["per"] == "token":
            padded = []
            for p, v in zip(parts, values):
                v = v if v is not None else torch.full(p.input_ids.shape, pad, dtype=have.dtype)
                fill = torch.full((v.shape[0], width - v.shape[1]), pad, dtype=v.dtype)
                padded.append(torch.cat([v, fill], dim=1))
            out[f.name] = torch.cat(padded)
        else:
            out[f.name] = torch.cat([v if v is not None else torch.full((p.n_rows,), pad, dtype=have.dtype)
                                     for p, v in zip(parts, values)])
    return Rows(**out)
