"""The user stages in examples/custom_advantage, used through the config like on the command line."""

import dataclasses

import pytest
import torch

from areal_trainer.advantage import TrajBatchMeta
from areal_trainer.components import load_config
from areal_trainer.config import StageConfig
from examples.custom_advantage.my_advantage import length_penalty, token_gae_kl_outside

from .helpers import actor, batch, close, run

MOD = "examples.custom_advantage.my_advantage"
# One prompt's four answers: correct in 3 and in 6 tokens, wrong in 3 and in 6 (the README's example).
MASK = [[0, 1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1]] * 2


def test_length_penalty_through_config():
    cfg = actor(max_new_tokens=8, advantage={"outcome_reward_shaping": {"implementation": f"{MOD}.length_penalty",
                                                                        "kwargs": {"coef": 0.4}}})
    out = run(batch([[0, 1, 1], [0, 1, 0]], [3, 3]), cfg)  # integer rewards are fine: it returns floats
    close(out.outcome_rewards, [3 - 0.4 * 2 / 8, 3 - 0.4 * 1 / 8])
    assert callable(length_penalty)


def _grpo_like(preset: str, stage: StageConfig | None, rewards: list[float], *extra: str):
    a = load_config(preset, ["gconfig.n_samples=4", "gconfig.max_new_tokens=8", *extra]).actor
    cfg = dataclasses.replace(a, advantage=dataclasses.replace(a.advantage, outcome_reward_shaping=stage))
    return run(batch(MASK, rewards), cfg, meta=TrajBatchMeta(traj_group_sizes=(4,)))


@pytest.mark.parametrize("preset", ["grpo", "drgrpo"])
def test_scaling_the_reward_cancels_but_the_length_penalty_reorders_a_group(preset):
    # Scaling divides out in the std (GRPO's group std; Dr.GRPO's batch adv_norm); the length penalty
    # ranks the shorter of two equally correct (or equally wrong) answers higher.
    plain = _grpo_like(preset, None, [1, 1, 0, 0])
    scaled = _grpo_like(preset, StageConfig("tests.plugins.scale_outcome", {"factor": 0.5}),
                        [1, 1, 0, 0])
    close(scaled.advantages, plain.advantages, atol=1e-4)
    shaped = _grpo_like(preset, StageConfig(f"{MOD}.length_penalty", {"coef": 0.1}), [1, 1, 0, 0])
    first = shaped.advantages[:, 1]
    assert first[0] > first[1] > 0 > first[2] > first[3], first
    assert plain.advantages[0, 1] == plain.advantages[1, 1]
    same = _grpo_like(preset, StageConfig(f"{MOD}.length_penalty", {"coef": 0.1}), [1, 1, 1, 1])
    assert torch.all(_grpo_like(preset, None, [1, 1, 1, 1]).advantages == 0)  # no signal without the penalty
    assert same.advantages[0, 1] > 0 > same.advantages[1, 1]


def test_kl_outside_estimator_keeps_kl_out_of_returns():
    # Token GAE on the task reward 2 only (returns 2 everywhere), KL [0,-.2,-.4,0] added to the advantages.
    cfg = actor(kl_ctl=1.0, gae_lambda="areal_trainer.advantage.lambda_fn.constant_gae_lambda",
                gae_lambda_kwargs={"value": 1.0},
                advantage={"estimator": {"implementation": f"{MOD}.token_gae_kl_outside", "kwargs": {}}})
    data = batch([[0, 1, 1, 1, 1]], [2.0], logprobs=[[0, 0, 0.2, 0.4, 0]], ref_logp=torch.zeros(1, 5))
    out = run(data, cfg)
    close(out.returns, [[2, 2, 2, 2, 0]])
    close(out.advantages, [[2, 1.8, 1.6, 2, 0]])
    assert callable(token_gae_kl_outside)


def test_length_penalty_counts_a_logical_rollouts_tokens_and_shapes_its_reference():
    from areal_trainer.advantage import OutcomeRewardInputs, RolloutGroup

    # Rows 0-1 are one logical rollout (1 + 2 tokens, explicit reference 0.5), row 2 another (4 tokens).
    meta = TrajBatchMeta(traj_group_sizes=(3,), rollout_groups=(RolloutGroup((2, 1), (0.5, None)),))
    data = batch([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], [1.0, 1.0, 0.0])
    out = length_penalty(OutcomeRewardInputs(data=data, config=actor(max_new_tokens=8), meta=meta), coef=1.0)
    close(out.rewards, [1 - 3 / 8, 1 - 3 / 8, -4 / 8])
    close(out.normalization_rewards, [0.5 - 3 / 8, -4 / 8])


def test_scaling_shows_only_where_no_std_divides_it_out():
    half = StageConfig("tests.plugins.scale_outcome", {"factor": 0.5})
    plain = _grpo_like("drgrpo", None, [1, 1, 0, 0], "actor.adv_norm=null")
    close(plain.advantages[:, 1], [5, 5, -5, -5])
    close(_grpo_like("drgrpo", half, [1, 1, 0, 0], "actor.adv_norm=null").advantages, plain.advantages * 0.5)
