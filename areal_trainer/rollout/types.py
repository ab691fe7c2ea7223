"""The contracts at the rollout/trainer boundary: what an inference engine and a workflow offer,
and the one type that crosses it, :class:`TrajectoryGroup` (its rows: ``rows.py``).

Policy versions. The trainer owns the policy version: the number of optimizer updates the
weights have seen (the step count). It hands weights to an engine together with their version
(``engine.update_weights(model, version)``); every token an engine samples carries the version of
the weights that sampled it (``Generation.versions``). A sequence whose generation spans a weight
update (a partial rollout, continued under the new weights) therefore carries two versions, and
rows are built from these per-token versions, never from a version read at build time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import torch

from .rows import KEYS, Rows, Segment, tensor_problems


@dataclass
class Generation:
    """One sampled answer.

    Attributes:
        output_ids: the tokens, ending with the stop token unless truncated.
        logprobs: behaviour log-probability of each token under the weights that sampled it.
        truncated: true when the answer hit ``max_new_tokens`` without a stop token.
        versions: the policy version of the weights that sampled each token.
    """

    output_ids: list[int]
    logprobs: list[float]
    truncated: bool
    versions: list[int]


@runtime_checkable
class InferenceEngine(Protocol):
    """A rollout backend (``rollout/engines/hf.py``: ``hf``; ``rollout/engines/vllm.py``: ``vllm``).

    ``generate`` may be called from a rollout thread while the trainer calls ``update_weights``
    from its own: an engine either makes them exclusive (``hf``: an update interrupts the running
    generation at a token boundary, loads the weights, and the generation continues under them)
    or is used by one thread only.
    """

    @property
    def version(self) -> int:
        """The version of the weights the engine samples with now."""

    def generate(self, prompts: list[list[int]], gconfig) -> list[Generation]:
        """One answer per prompt, in prompt order (repeat a prompt to sample it several times). An engine that
        samples image prompts (``EngineSpec.takes_images``) also takes ``vision=``, each prompt's images."""

    def update_weights(self, model: torch.nn.Module, version: int) -> None:
        """Sample from ``model``'s current weights, which are policy version ``version``, from now on."""


def answer_segment(gen: Generation, turn_id: int = 0) -> Segment:
    """The trainable segment of a sampled answer."""
    return Segment(list(gen.output_ids), True, list(gen.logprobs), list(gen.versions), turn_id)


@dataclass
class TrajectoryGroup:
    """The sampled trajectories of one prompt: the unit a workflow returns and the trainer trains on.

    ``rows`` are its ``G`` rows (one per answer, episode or call) as :class:`~areal_trainer.rollout.rows.Rows`
    (a workflow may give a plain dict of the same tensors, which is checked and wrapped).

    ``stats`` are this group's reward metrics (``reward/errors``, ``reward/timeouts``, ... and each
    source's mean; ``RewardScores.typed``), combined over the groups of a step by their reductions.
    ``prompt_id`` is the prompt's dataset row, set by the trainer's rollout source. ``episode_rows`` /
    ``episode_rewards`` say which rows belong to one episode (agents' per-call rows).

    Read access by key (``group["rewards"]``) goes to the rows, so a dynamic filter sees the group like a
    dict.
    """

    rows: Rows
    stats: dict[str, Any] = field(default_factory=dict)
    prompt_id: int | None = None
    episode_rows: tuple[int, ...] | None = None
    """Rows of each episode, in row order, when an episode may have several rows (agents: one per call);
    None: every row is its own episode. Group statistics count episodes."""
    episode_rewards: tuple[float, ...] | None = None
    """Each episode's reward (the discounted return of its first call), the value group statistics use."""
    source_values: dict[str, tuple[float | None, ...]] | None = None
    """Each reward source's own value per row, by its metric name (``reward/<name>``; None where it gave no
    number), before the weighted sum: the held-out accuracy reads its verifier's values from here
    (``evaluator.verifier``). The built-in workflows set it (a multi-turn row: its last answer's values)."""
    vision: tuple | None = None
    """Each row's images for an image-text-to-text model (``model/vision.py``'s ``VisionInput``, None for a text
    row; the rows of one prompt share one object), or None when no row has any: every training-side forward of
    the rows takes them, so each sees the images the engine sampled with."""

    def __post_init__(self) -> None:
        if not isinstance(self.rows, Rows):
            self.rows = Rows.from_tensors(self.rows, "TrajectoryGroup(...)")

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]:
        """The rows' tensors by key, read-only (``dataclasses.replace(group.rows, ...)`` makes changed rows)."""
        return MappingProxyType(self.rows.as_dict())

    def __getitem__(self, key: str) -> torch.Tensor:
        value = getattr(self.rows, key, None) if key in KEYS else None
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in KEYS and getattr(self.rows, key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def keys(self):
        return self.rows.as_dict().keys()

    @property
    def n_rows(self) -> int:
        return self.rows.n_rows

    @property
    def min_version(self) -> int:
        """The oldest policy version of any sampled token (-1 when nothing was sampled)."""
        v = self.rows.versions
        v = v[v >= 0]
        return int(v.min()) if v.numel() else -1

    def problems(self, label: str) -> list[str]:
        """What is wrong with this group as a workflow output beyond its tensors, which its rows checked
        (empty when it is well formed)."""
        n = self.n_rows
        if self.episode_rows is not None and (sum(self.episode_rows) != n or min(self.episode_rows) < 1
                                              or len(self.episode_rewards or ()) != len(self.episode_rows)):
            return [f"{label}: episode_rows {self.episode_rows} must be positive and sum to the group's {n} "
                    "rows, with one episode_rewards entry each."]
        if self.vision is not None and len(self.vision) != n:
            return [f"{label}: vision has {len(self.vision)} entries for the group's {n} rows; give one per row "
                    "(None for a row without images)."]
        return []


def group_problems(obj: Any, label: str) -> list[str]:
    """What is wrong with a workflow's output item, a :class:`TrajectoryGroup` or a dict of its tensors."""
    if isinstance(obj, TrajectoryGroup):
        return obj.problems(label)
    return tensor_problems(obj, label)


def as_group(obj: TrajectoryGroup | Mapping[str, torch.Tensor]) -> TrajectoryGroup:
    """A workflow output as a :class:`TrajectoryGroup` (a plain dict of tensors is checked and wrapped)."""
    if isinstance(obj, TrajectoryGroup):
        return obj
    return TrajectoryGroup(Rows.from_tensors(obj))


@runtime_checkable
class Workflow(Protocol):
    """Turns prompts into trajectory groups. Built once as ``cls(engine=..., tokenizer=...,
    reward=..., **rollout.workflow_kwargs)``; ``reward`` is the run's reward service: ``reward.score_completions(
    samples, completions)`` scores each completion text against its dataset sample and returns the rewards
    (``.rewards``) and the counters and source means of any slice (``.typed(lo, hi)``, a group's ``stats``)."""

    def rollout(self, samples: list[dict], gconfig) -> list[TrajectoryGroup]:
        """One group per sample, in order; a sample is ``{"messages", "prompt", "answer", "fields", "row"}``
        (``data/datasets.py``)."""
