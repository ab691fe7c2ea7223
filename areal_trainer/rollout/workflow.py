"""Workflows turn prompts into trajectories. ``RLVRWorkflow`` is the single-turn workflow with a
verifiable reward: sample ``gconfig.n_samples`` answers per prompt and score each one.

A workflow is any class built as ``cls(engine=..., tokenizer=..., reward=..., **rollout.workflow_kwargs)``
whose ``rollout(samples, gconfig)`` returns one trajectory group per sample (see ``rollout/batch.py``):
``input_ids``, ``attention_mask``, ``loss_mask``, ``logprobs`` (behaviour), ``turn_ids``, ``versions``
``[G, L]`` and ``rewards``, ``is_truncated`` ``[G]``, plus ``num_turns`` ``[G]`` for logging.
"""

from __future__ import annotations

import torch

from ..config.schema import GenerationHyperparameters
from .batch import make_row, stack_rows


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat prompt, ending with the assistant turn's opening."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


class RLVRWorkflow:
    """Single-turn reinforcement learning with verifiable rewards."""

    def __init__(self, *, engine, tokenizer, reward):
        self.engine, self.tokenizer, self.reward = engine, tokenizer, reward
        self.reward_errors = 0

    def rollout(self, samples: list[dict], gconfig: GenerationHyperparameters) -> list[dict[str, torch.Tensor]]:
        g = gconfig.n_samples
        prompts = [prompt_ids(self.tokenizer, s["messages"]) for s in samples]
        gens = self.engine.generate([p for p in prompts for _ in range(g)], gconfig)
        texts = [self.tokenizer.decode(x.output_ids, skip_special_tokens=True) for x in gens]
        rewards, errors = self.reward(
            [s["messages"][-1]["content"] for s in samples for _ in range(g)], texts,
            [s["answer"] for s in samples for _ in range(g)])
        self.reward_errors += errors
        groups = []
        for i, p in enumerate(prompts):
            rows = [make_row([(p, False, None, -1), (x.output_ids, True, x.logprobs, 0)], self.engine.version)
                    for x in gens[i * g:(i + 1) * g]]
            group = stack_rows(rows)
            group["rewards"] = torch.tensor(rewards[i * g:(i + 1) * g], dtype=torch.float32)
            group["is_truncated"] = torch.tensor([x.truncated for x in gens[i * g:(i + 1) * g]])
            group["num_turns"] = torch.ones(g)
            groups.append(group)
        return groups
