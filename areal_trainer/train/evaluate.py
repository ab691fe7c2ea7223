"""Held-out evaluation: run the workflow on the validation prompts with ``eval_gconfig``.

A sample (an episode, for agents) counts as correct when its reward is positive (``reward.is_correct``).
``eval/accuracy`` is pass@1 (the mean over all samples); with ``eval_gconfig.n_samples = k > 1`` also ``eval/pass@k`` (a prompt passes when
any of its k samples is correct). When ``examples`` is a list, the first trajectory group is
appended to it (the trainer prints its first sample on the console).
"""

from __future__ import annotations

import torch

from ..config.schema import GenerationHyperparameters
from ..metrics import Mean, Metric, reduce
from ..reward import is_correct
from .collect import rollout_groups


def evaluate(workflow, samples: list[dict], gconfig: GenerationHyperparameters, batch_size: int,
             examples: list | None = None) -> dict[str, Metric]:
    correct, rewards, stats = [], [], []
    for i in range(0, len(samples), batch_size):
        batch = samples[i:i + batch_size]
        for group in rollout_groups(workflow, batch, range(i, i + len(batch)), gconfig):  # checked like training
            if examples is not None and not examples:
                examples.append(group)
            r = _episode_rewards(group)
            rewards.append(r)
            correct.append(is_correct(r).float())
            stats.append(getattr(group, "stats", {}))
    c, r = torch.cat(correct), torch.cat(rewards)
    n, prompts = float(c.numel()), float(len(correct))
    out = {"eval/accuracy": Mean(float(c.mean()), n), "eval/reward": Mean(float(r.mean()), n),
           **{f"eval/{k}": v for k, v in reduce(stats).items()}}
    if gconfig.n_samples > 1:
        out["eval/pass@k"] = Mean(float(torch.stack([x.max() for x in correct]).mean()), prompts)
    return out


def _episode_rewards(group) -> torch.Tensor:
    """One reward per episode: the rows' rewards, or an agent group's episode rewards (its rows are calls)."""
    if getattr(group, "episode_rows", None):
        return torch.tensor(group.episode_rewards, dtype=torch.float32)
    return group["rewards"].float()
