"""Workflows turn prompts into trajectories. ``RLVRWorkflow`` is the single-turn workflow with a
verifiable reward: sample ``gconfig.n_samples`` answers per prompt and score each one.

A workflow (the :class:`~areal_trainer.rollout.types.Workflow` protocol) is built as
``cls(engine=..., tokenizer=..., reward=..., **rollout.workflow_kwargs)`` and its
``rollout(samples, gconfig)`` returns one :class:`~areal_trainer.rollout.types.TrajectoryGroup`
per sample. Rows are built from the engine's per-token policy versions (``Generation.versions``).

Images. A sample of an image-text-to-text model carries its images (``model/vision.py``: ``prompt_inputs``);
the engine samples with them and each group keeps them for the training forwards (``TrajectoryGroup.vision``).

Length. A row's prompt plus answer stay within the row limit (``rollout/limits.py``: ``gconfig.max_tokens`` or
the model's positions, the smaller): each answer has at most ``min(gconfig.max_new_tokens, limit -
prompt tokens)`` tokens. The engines sample no more; the workflow cuts an answer that is longer.
"""

from __future__ import annotations

from typing import Any

from ...model.chat import prompt_ids
from ...model.vision import has_images, prompt_inputs
from ..limits import capped, engine_positions, new_token_caps
from ..rows import Rows, Segment
from ..types import TrajectoryGroup, answer_segment


class RLVRWorkflow:
    """Single-turn reinforcement learning with verifiable rewards."""

    takes_images = True
    """It samples image prompts with their images and hands them to the training forwards (docs/vlm.md); a
    workflow class without this flag set is not given image rows."""

    def __init__(self, *, engine, tokenizer, reward):
        self.engine, self.tokenizer, self.reward = engine, tokenizer, reward

    def rollout(self, samples: list[dict], gconfig: Any) -> list[TrajectoryGroup]:
        g = gconfig.n_samples
        prompts, vision = zip(*(prompt_inputs(self.tokenizer, s) for s in samples)) if samples else ((), ())
        rows = [p for p in prompts for _ in range(g)]
        caps = new_token_caps([len(p) for p in rows], gconfig, engine_positions(self.engine))
        images = has_images(vision)  # an image prompt's rows share its images (one object)
        row_vision = [v for v in vision for _ in range(g)]
        gens = capped(self.engine.generate(rows, gconfig, vision=row_vision) if images else
                      self.engine.generate(rows, gconfig), caps)
        texts = [self.tokenizer.decode(x.output_ids, skip_special_tokens=True) for x in gens]
        scores = self.reward.score_completions([s for s in samples for _ in range(g)], texts)
        groups = []
        for i, p in enumerate(prompts):
            mine = gens[i * g:(i + 1) * g]
            rows = Rows.from_segments([[Segment(p), answer_segment(x)] for x in mine],
                                      rewards=scores.rewards[i * g:(i + 1) * g], truncated=[x.truncated for x in mine],
                                      num_turns=[1.0] * g)
            groups.append(TrajectoryGroup(rows, stats=scores.typed(i * g, (i + 1) * g), source_values={
                name: tuple(v[i * g:(i + 1) * g]) for name, v in scores.values.items()},
                vision=(vision[i],) * g if vision[i] is not None else None))
        return groups
__all__ = ["RLVRWorkflow", "prompt_ids"]
