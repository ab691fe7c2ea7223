"""Agents' per-call rows in a step: the batch keeps each group's episodes, and group statistics (GRPO's
mean and std, Dr.GRPO's and RLOO's baselines) count each episode once, however many calls it made."""

import pytest
import torch

from areal_trainer.advantage import AdvantageInputs
from areal_trainer.components import load
from areal_trainer.rollout.rows import Segment, make_row, stack_rows
from areal_trainer.rollout.types import TrajectoryGroup
from areal_trainer.train.batch import TrainBatch
from areal_trainer.train.step import batch_meta


def _group(rewards, episode_rows=None, episode_rewards=None):
    rows = [make_row([Segment([1, 2]), Segment([3, 4], True, [-1.0, -1.0], [0, 0], 0)]) for _ in rewards]
    t = stack_rows(rows)
    t.update(rewards=torch.tensor(rewards), is_truncated=torch.zeros(len(rewards), dtype=torch.bool))
    return TrajectoryGroup(t, episode_rows=episode_rows, episode_rewards=episode_rewards)


def _advantages(algo, groups):
    batch = TrainBatch.from_groups(groups, torch.device("cpu"))
    built = load(algo, ["actor.kl_ctl=0", "actor.adv_norm=null", "actor.reward_scaling=1", "actor.reward_bias=0"])
    res = built.advantage(AdvantageInputs(batch.rollout_data(), built.config.actor, meta=batch_meta(batch)))
    return res.advantages[:, 1].tolist()  # the first answer token's advantage (next-token aligned)


def test_the_batch_carries_the_episodes_of_each_group():
    agent = _group([1.0, 1.0, 1.0, 0.0], episode_rows=(3, 1), episode_rewards=(1.0, 0.0))
    batch = TrainBatch.from_groups([agent, _group([1.0, 0.0])], torch.device("cpu"))
    assert batch.episodes == (((3, 1), (1.0, 0.0)), None)
    meta = batch_meta(batch)
    assert meta.logical_group_sizes == (2, 2) and meta.logical_row_counts == (3, 1, 1, 1)
    assert batch_meta(TrainBatch.from_groups([_group([1.0, 0.0])], torch.device("cpu"))).rollout_groups == (None,)


@pytest.mark.parametrize("algo,expected", [
    # episodes rewarded 1 (3 calls) and 0 (1 call): the group mean is 0.5, not the row mean 0.75
    ("drgrpo", [0.5, 0.5, 0.5, -0.5]),
    # GRPO also divides by the episodes' std (0.5 for one 1 and one 0, unbiased: 0.7071)
    ("grpo", None),
    # RLOO: each episode's baseline is the other episode's reward
    ("rloo", [1.0, 1.0, 1.0, -1.0]),
])
def test_group_statistics_count_episodes_not_calls(algo, expected):
    agent = _group([1.0, 1.0, 1.0, 0.0], episode_rows=(3, 1), episode_rewards=(1.0, 0.0))
    adv = _advantages(algo, [agent])
    if expected is None:  # GRPO: (r - mean) / std over the two episodes, std of {1, 0}
        std = torch.tensor([1.0, 0.0]).std().item()
        expected = [0.5 / std] * 3 + [-0.5 / std]
    assert adv == pytest.approx(expected, rel=1e-4)
    # the same episodes, one row each, give the same advantages
    assert _advantages(algo, [_group([1.0, 0.0])]) == pytest.approx([expected[0], expected[-1]], rel=1e-4)


def test_turn_level_gae_runs_on_merged_agent_rows():
    from areal_trainer.rollout.agents.session import CallRecord
    from areal_trainer.rollout.agents.trajectory import discounted_rewards, export_rows

    def episode(reward):
        recs = [CallRecord("a", 0, 0, [1, 2], [3, 4, 5], [-1.0] * 3, [0] * 3, False),
                CallRecord("b", 0, 1, [1, 2, 3, 4, 5, 6, 7], [8, 9], [-1.0] * 2, [0] * 2, False)]
        rows, fallbacks = export_rows(recs, discounted_rewards([None, reward], 0.9), "concat")
        assert fallbacks == 0 and len(rows) == 1
        return rows[0]

    rows = [episode(1.0), episode(0.0)]
    t = stack_rows([make_row(r.segments) for r in rows])
    t.update(rewards=torch.tensor([r.reward for r in rows]), is_truncated=torch.zeros(2, dtype=torch.bool),
             num_turns=torch.tensor([2.0, 2.0]))
    group = TrajectoryGroup(t, episode_rows=(1, 1), episode_rewards=(0.9, 0.0))
    batch = TrainBatch.from_groups([group], torch.device("cpu"))
    built = load("grpo", ["actor.gae_timestep_unit=turn"])
    res = built.advantage(AdvantageInputs(batch.rollout_data(), built.config.actor, meta=batch_meta(batch)))
    m = res.loss_mask.bool()
    assert bool(torch.isfinite(res.advantages).all()) and bool((res.advantages[~m] == 0).all())
    aligned = torch.roll(batch.turn_ids, -1, dims=1)
    aligned[:, -1] = -1
    for r in range(2):  # one advantage per turn of each merged row
        assert sorted(torch.unique(aligned[r][m[r]]).tolist()) == [0, 1]
        for u in (0, 1):
            vals = res.advantages[r][m[r] & (aligned[r] == u)]
            assert torch.allclose(vals, vals[0].expand_as(vals))
