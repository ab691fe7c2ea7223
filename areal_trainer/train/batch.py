"""The typed batches of a step: built once, read-only, split by rows.

* :class:`TrainBatch`: the step's trajectory rows as the rollout produced them (token-aligned ``[B, S]``
  tensors and per-row ``[B]`` values), with each prompt group's row count.
* :class:`UpdateBatch`: what the policy update trains on: the rows, the advantage's aligned loss mask
  and advantages, and the step's policies as one :class:`~areal_trainer.loss.PolicyLogprobs` (sliced
  with its own ``rows``, never flattened into a dict).
* :class:`CriticBatch`: what the critic update trains on.

``select(rows)`` gives the same batch restricted to ``rows`` (a 1-D index tensor) and trimmed to the
longest selected row: minibatches and micro-batches are selections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType

import torch

from ..loss import PolicyLogprobs
from ..rollout.rows import Rows, concat_rows
from ..rollout.types import TrajectoryGroup, as_group

_GROUPING = ("group_sizes", "prompt_ids", "episodes", "vision")
"""The fields of :class:`TrainBatch` that are not row tensors: its prompt groups, and its rows' images."""


def _width(attention_mask: torch.Tensor) -> int:
    return int(attention_mask.sum(1).max()) if attention_mask.shape[0] else 0


def _cut(t: torch.Tensor | None, idx: torch.Tensor, width: int) -> torch.Tensor | None:
    if t is None:
        return None
    t = t[idx]
    return t[:, :width] if t.dim() == 2 else t


def _pick(vision: tuple, idx: torch.Tensor) -> tuple:
    """The rows ``idx`` of a per-row tuple (empty stays empty: no row has images)."""
    return tuple(vision[i] for i in idx.tolist()) if vision else ()


def _vision(groups: Sequence[TrajectoryGroup]) -> tuple:
    """Each row's images (None for a text row), or () when no group has any."""
    if all(g.vision is None for g in groups):
        return ()
    return tuple(v for g in groups for v in (g.vision if g.vision is not None else (None,) * g.n_rows))


def _episodes(groups: Sequence[TrajectoryGroup]) -> tuple:
    """Each group's episode rows and rewards (None for a group whose rows are its episodes); () if none has them."""
    out = tuple((tuple(g.episode_rows), tuple(g.episode_rewards)) if g.episode_rows else None for g in groups)
    return out if any(e is not None for e in out) else ()


@dataclass(frozen=True)
class TrainBatch(Rows):
    """One step's rows, all on one device: the prompt groups' :class:`~areal_trainer.rollout.rows.Rows`
    concatenated (its fields describe each tensor, ``[B, S]`` and ``[B]``), with the groups they came in.

    Attributes:
        group_sizes: rows of each prompt group, in row order.
        prompt_ids: the dataset row of each prompt group (None where unknown).
        episodes: per prompt group, ``(rows of each episode, reward of each episode)`` when an episode
            may have several rows (agents), else None; empty when no group has them.
        vision: each row's images (``model/vision.py``; None for a text row), empty when no row has any.
    """

    group_sizes: tuple[int, ...] = ()
    prompt_ids: tuple[int | None, ...] = ()
    episodes: tuple[tuple[tuple[int, ...], tuple[float, ...]] | None, ...] = ()
    vision: tuple = ()

    @classmethod
    def from_groups(cls, groups: Sequence[TrajectoryGroup | Mapping[str, torch.Tensor]],
                    device: torch.device) -> TrainBatch:
        """The groups (or dicts of their tensors) concatenated in order, on ``device``."""
        groups = [as_group(g) for g in groups]
        rows = concat_rows([g.rows for g in groups])
        return cls(**{k: v.to(device) for k, v in rows.as_dict().items()}, group_sizes=tuple(g.n_rows for g in groups),
                   prompt_ids=tuple(g.prompt_id for g in groups), episodes=_episodes(groups), vision=_vision(groups))

    @property
    def lengths(self) -> list[int]:
        return self.attention_mask.sum(1).tolist()

    def select(self, idx: torch.Tensor) -> TrainBatch:
        """Rows ``idx`` (group sizes no longer apply to a selection and are dropped)."""
        w = _width(self.attention_mask[idx])
        cut = {f.name: _cut(getattr(self, f.name), idx, w) for f in fields(self) if f.name not in _GROUPING}
        return TrainBatch(**cut, group_sizes=(), vision=_pick(self.vision, idx))

    def rollout_data(self, **forwards: torch.Tensor | None) -> Mapping[str, torch.Tensor]:
        """The read-only mapping the advantage reads (``AdvantageInputs.data``): the rollout tensors plus
        the forwards given (``ref_logp``, ``values``, next-token aligned), None ones left out."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _GROUPING}
        data.update(forwards)
        return MappingProxyType({k: v for k, v in data.items() if v is not None})


@dataclass(frozen=True)
class UpdateBatch:
    """The policy update's rows (``[B, S]``, next-token aligned except the ids and mask).

    Attributes:
        input_ids, attention_mask: the rows.
        loss_mask: the advantage's aligned loss mask.
        advantages: per token.
        policies: behaviour and proximal log-probs and versions, as the loss takes them.
        vision: each row's images (empty: no row has any).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    policies: PolicyLogprobs
    vision: tuple = ()

    def select(self, idx: torch.Tensor) -> UpdateBatch:
        w = _width(self.attention_mask[idx])
        pol = self.policies.rows(idx, w)
        return UpdateBatch(_cut(self.input_ids, idx, w), _cut(self.attention_mask, idx, w),
                           _cut(self.loss_mask, idx, w), _cut(self.advantages, idx, w), pol, _pick(self.vision, idx))


@dataclass(frozen=True)
class CriticBatch:
    """The critic update's rows: ids, mask, the aligned loss mask, the values the advantage used, returns."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_values: torch.Tensor
    returns: torch.Tensor
    vision: tuple = ()
    """Each row's images (empty: no row has any)."""

    def select(self, idx: torch.Tensor) -> CriticBatch:
        w = _width(self.attention_mask[idx])
        return CriticBatch(*(_cut(getattr(self, f.name), idx, w) for f in fields(self) if f.name != "vision"),
                           vision=_pick(self.vision, idx))
