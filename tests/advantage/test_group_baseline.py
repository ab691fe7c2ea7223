"""The group-baseline slot: by default reward_norm (the presets are unchanged, see the golden
records); a user baseline by import path replaces it, with its output checked; the pass@k example
gives the hand-derived numbers and reduces to GRPO's standardisation at k = 1."""

import math

import pytest
import torch

from areal_trainer.advantage import GroupBaselineInputs, TrajBatchMeta
from areal_trainer.errors import PluginOutputError
from examples.group_baseline.pass_at_k import pass_at_k

from ..plugins import SEEN
from .helpers import actor, batch, close, norm, run

PASS_K = "examples.group_baseline.pass_at_k.pass_at_k"


def stage(impl, **kwargs):
    return {"implementation": impl, "kwargs": kwargs}


def _inputs(rewards, sizes):
    r = torch.tensor(rewards, dtype=torch.float32)
    return GroupBaselineInputs(scores=r, rewards=r, group_sizes=tuple(sizes), loss_mask=torch.ones(len(rewards), 3),
                               all_reduce=None, config=None)


def test_pass_at_k_hand_derived():
    # One right of four, k = 2: R = 1 - C(3,2)/C(4,2) = 1/2, s = 1/2; right (1 - 1/2)/(1/2) = 1;
    # wrong (1 - 1/2 - C(2,1)/C(3,1))/(1/2) = -1/3. Second group all wrong: no signal.
    out = pass_at_k(_inputs([1, 0, 0, 0, 0, 0], [4, 2]), k=2)
    close(out, [1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0])


def test_pass_at_1_is_group_standardisation():
    out = pass_at_k(_inputs([1, 0, 0, 0], [4]), k=1)
    std = math.sqrt(0.25 * 0.75)  # population std of [1, 0, 0, 0]
    close(out, [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])


def test_a_user_group_baseline_replaces_reward_norm_in_the_pipeline():
    data = batch([[0, 1, 1]] * 4, [1.0, 0.0, 0.0, 0.0])
    cfg = actor(reward_norm=norm("group", "group"),
                advantage={"group_baseline": stage(PASS_K, k=2)})
    out = run(data, cfg, meta=TrajBatchMeta(traj_group_sizes=(4,)))
    close(out.outcome_rewards, [1.0, -1 / 3, -1 / 3, -1 / 3])
    close(out.advantages[:, :2], [[1.0, 1.0]] + [[-1 / 3, -1 / 3]] * 3)


def test_the_baseline_sees_scaled_scores_and_raw_rewards():
    cfg = actor(reward_bias=-0.5, reward_scaling=10.0,
                advantage={"group_baseline": stage("tests.plugins.record_baseline")})
    run(batch([[0, 1]] * 2, [1.0, 0.0]), cfg, meta=TrajBatchMeta(traj_group_sizes=(2,)))
    assert SEEN["baseline"] == {"scores": [5.0, -5.0], "rewards": [1.0, 0.0], "sizes": (2,)}


def test_a_bad_baseline_output_names_the_stage():
    cfg = actor(advantage={"group_baseline": stage("tests.plugins.wrong_shape_baseline")})
    with pytest.raises(PluginOutputError, match=r"actor.advantage.group_baseline \(tests.plugins."
                                         r"wrong_shape_baseline\).*shape"):
        run(batch([[0, 1]] * 2, [1.0, 0.0]), cfg, meta=TrajBatchMeta(traj_group_sizes=(2,)))
