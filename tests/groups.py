"""Small well-formed trajectory groups for tests that do not need a model."""

from __future__ import annotations

import torch

from areal_trainer.rollout.rows import Segment, make_row, stack_rows
from areal_trainer.rollout.types import TrajectoryGroup


def make_group(rewards, *, versions=None, prompt=(5, 6), answer_len: int = 2) -> TrajectoryGroup:
    """One group with a row per reward: the prompt tokens, then ``answer_len`` sampled tokens whose
    policy versions are ``versions[row]`` (an int or a list per token; default 0)."""
    rows = []
    for j, _ in enumerate(rewards):
        v = 0 if versions is None else versions[j]
        v = [v] * answer_len if isinstance(v, int) else list(v)
        rows.append(make_row([Segment(list(prompt)), Segment([7] * len(v), True, [-0.5] * len(v), v, 0)]))
    tensors = stack_rows(rows)
    tensors["rewards"] = torch.tensor([float(r) for r in rewards])
    tensors["is_truncated"] = torch.zeros(len(rewards), dtype=torch.bool)
    return TrajectoryGroup(tensors)


def reward_service(path: str = "areal_trainer.reward.math.gsm8k_reward_fn", workers: int = 0, **kwargs):
    """A reward service of one function, run in this process (``workers=0``) unless asked otherwise."""
    from areal_trainer.reward.functions import RewardFunction
    from areal_trainer.reward.service import FunctionReward, RewardService

    return RewardService([FunctionReward(RewardFunction.bind(path, kwargs={}, key="reward.fn"), workers=workers)],
                         **kwargs)
