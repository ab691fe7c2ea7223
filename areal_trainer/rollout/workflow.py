"""Workflows turn prompts into trajectories. ``RLVRWorkflow`` is the single-turn workflow with a
verifiable reward: sample ``gconfig.n_samples`` answers per prompt and score each one.

A workflow (the :class:`~areal_trainer.rollout.types.Workflow` protocol) is built as
``cls(engine=..., tokenizer=..., reward=..., **rollout.workflow_kwargs)`` and its
``rollout(samples, gconfig)`` returns one :class:`~areal_trainer.rollout.types.TrajectoryGroup`
per sample. Rows are built from the engine's per-token policy versions (``Generation.versions``).
"""

from __future__ import annotations

from typing import Any

import torch

from .batch import make_row, stack_rows
from .types import Segment, TrajectoryGroup, answer_segment


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat prompt, ending with the assistant turn's opening."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


class RLVRWorkflow:
    """Single-turn reinforcement learning with verifiable rewards."""

    def __init__(self, *, engine, tokenizer, reward):
        self.engine, self.tokenizer, self.reward = engine, tokenizer, reward

    def rollout(self, samples: list[dict], gconfig: Any) -> list[TrajectoryGroup]:
        g = gconfig.n_samples
        prompts = [prompt_ids(self.tokenizer, s["messages"]) for s in samples]
        gens = self.engine.generate([p for p in prompts for _ in range(g)], gconfig)
        texts = [self.tokenizer.decode(x.output_ids, skip_special_tokens=True) for x in gens]
        scores = self.reward.score_completions([s for s in samples for _ in range(g)], texts)
        groups = []
        for i, p in enumerate(prompts):
            mine = gens[i * g:(i + 1) * g]
            tensors = stack_rows([make_row([Segment(p), answer_segment(x)]) for x in mine])
            tensors["rewards"] = torch.tensor(scores.rewards[i * g:(i + 1) * g], dtype=torch.float32)
            tensors["is_truncated"] = torch.tensor([x.truncated for x in mine])
            tensors["num_turns"] = torch.ones(g)
            groups.append(TrajectoryGroup(tensors, stats=scores.typed(i * g, (i + 1) * g)))
        return groups
