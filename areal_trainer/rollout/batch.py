"""Trajectory tensors: build one row from its segments, pad rows into a group, and concatenate groups.

A group's tensors are right-padded and token-aligned (``[G, L]``; ``rewards`` and ``is_truncated``
are ``[G]``; see :class:`~areal_trainer.rollout.types.TrajectoryGroup`). ``concat_groups`` pads every
group to the widest row and stacks them into the batch, recording the rows of each group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .types import ROW_KEYS, Segment, TrajectoryGroup

PAD_VALUES = {"input_ids": 0, "attention_mask": 0, "loss_mask": 0, "logprobs": 0.0, "turn_ids": -1, "versions": -1,
              "token_rewards": 0.0}
__all__ = ["PAD_VALUES", "ROW_KEYS", "concat_groups", "make_row", "select_rows", "stack_rows"]


def make_row(segments: Sequence[Segment]) -> dict[str, torch.Tensor]:
    """One trajectory row from its segments in order (see :class:`~areal_trainer.rollout.types.Segment`).

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


def concat_groups(groups: Sequence[TrajectoryGroup | Mapping[str, torch.Tensor]]
                  ) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Concatenate trajectory groups into one ``[B, S]`` batch; also return the rows per group."""
    tensors = [g.tensors if isinstance(g, TrajectoryGroup) else g for g in groups]
    width = max(t["input_ids"].shape[1] for t in tensors)
    out: dict[str, torch.Tensor] = {}
    for key, first in tensors[0].items():
        if first.dim() == 2:
            parts = []
            for g in tensors:
                t = g[key]
                pad = torch.full((t.shape[0], width - t.shape[1]), PAD_VALUES.get(key, 0), dtype=t.dtype)
                parts.append(torch.cat([t, pad], dim=1))
            out[key] = torch.cat(parts)
        else:
            out[key] = torch.cat([g[key] for g in tensors])
    return out, [int(t["input_ids"].shape[0]) for t in tensors]


def select_rows(batch: dict[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows ``idx`` of every tensor, trimmed to the longest selected row."""
    sub = {k: v[idx] for k, v in batch.items()}
    width = int(sub["attention_mask"].sum(1).max()) if len(idx) else 0
    return {k: (v[:, :width] if v.dim() == 2 else v) for k, v in sub.items()}
