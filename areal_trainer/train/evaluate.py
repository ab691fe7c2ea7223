"""Held-out evaluation: run the workflow on the validation prompts with ``eval_gconfig``.

A sample counts as correct when its reward is positive. ``eval/accuracy`` is pass@1 (the mean over
all samples); with ``eval_gconfig.n_samples = k > 1`` also ``eval/pass@k`` (a prompt passes when
any of its k samples is correct).
"""

from __future__ import annotations

import torch

from ..config.schema import GenerationHyperparameters


def evaluate(workflow, samples: list[dict], gconfig: GenerationHyperparameters, batch_size: int) -> dict[str, float]:
    correct, rewards = [], []
    for i in range(0, len(samples), batch_size):
        for group in workflow.rollout(samples[i:i + batch_size], gconfig):
            r = group["rewards"].float()
            rewards.append(r)
            correct.append((r > 0).float())
    c = torch.stack(correct)  # [prompts, k]
    out = {"eval/accuracy": float(c.mean()), "eval/reward": float(torch.stack(rewards).mean())}
    if c.shape[1] > 1:
        out["eval/pass@k"] = float(c.max(dim=1).values.mean())
    return out
