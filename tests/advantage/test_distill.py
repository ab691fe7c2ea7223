"""The advantage side of on-policy distillation: pure distillation computes no reward and no GAE,
MOPD's immutable behaviour log-probs flow through the default pipeline and must come from a full
replacement, and the advantage form's term."""

import pytest
import torch

from areal_trainer.advantage import AdvantageInputs
from areal_trainer.advantage.distill import add_distill_advantage, distillation_only
from areal_trainer.components.advantage import bind_advantage
from areal_trainer.errors import PluginOutputError

from .helpers import actor, batch, norm

LOSS_MASK = [[0, 1, 1, 0], [0, 1, 1, 1]]
LOGP = [[0.0, -0.5, -0.25, 0.0], [0.0, -1.0, -2.0, -3.0]]
ALIGNED = [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]
BEHAV = [[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, 0.0]]


def _data():
    return batch(LOSS_MASK, [1.0, 0.0], logprobs=LOGP)


def test_pure_distillation_computes_no_reward_and_no_advantage():
    out = distillation_only(AdvantageInputs(_data(), actor(), mopd=True))
    assert out.loss_mask.tolist() == ALIGNED
    assert out.advantages.abs().sum() == 0 and out.returns.abs().sum() == 0 and out.outcome_rewards.abs().sum() == 0
    assert out.logprobs.tolist() == BEHAV
    assert out.extras["mopd_behavior_logprobs"].tolist() == BEHAV
    assert "mopd_behavior_logprobs" not in distillation_only(AdvantageInputs(_data(), actor())).extras


def test_default_pipeline_stores_the_behaviour_logprobs_only_for_mopd():
    cfg = actor(reward_norm=norm("group", "group", group_size=2))
    fn = bind_advantage(cfg)
    assert "mopd_behavior_logprobs" not in fn(AdvantageInputs(_data(), cfg)).extras
    # pi_old recomputed (recompute_logprob): MOPD's IS weight still uses the rollout's own log-probs
    recomputed = torch.full((2, 4), -7.0)
    out = fn(AdvantageInputs(_data(), cfg, old_logprobs=recomputed, mopd=True))
    assert out.extras["mopd_behavior_logprobs"].tolist() == BEHAV
    assert out.logprobs.tolist() == (recomputed * torch.tensor(ALIGNED)).tolist()


def test_a_full_replacement_must_store_the_behaviour_logprobs_with_mopd():
    cfg = actor(advantage={"compute": {"implementation": "tests.plugins.constant_advantages"}})
    fn = bind_advantage(cfg)
    fn(AdvantageInputs(_data(), cfg))  # fine without MOPD
    with pytest.raises(PluginOutputError, match=r"tests.plugins.constant_advantages.*mopd_behavior_logprobs"):
        fn(AdvantageInputs(_data(), cfg, mopd=True))
    cfg = actor(advantage={"compute": {"implementation": "tests.plugins.mopd_replacement"}})
    out = bind_advantage(cfg)(AdvantageInputs(_data(), cfg, mopd=True))
    assert out.extras["mopd_behavior_logprobs"].tolist() == BEHAV


def test_advantage_form_replaces_only_the_advantages():
    base = distillation_only(AdvantageInputs(_data(), actor()))
    teacher = torch.tensor([[-1.0, -1.0, 0.0, 0.0], [-1.0, -1.0, -1.0, 0.0]])
    out = add_distill_advantage(base, teacher, rl_weight=1.0, coef=2.0)
    # 0 - 2 (old - T) on trained tokens
    assert out.advantages.tolist() == [[-1.0, -1.5, 0.0, 0.0], [0.0, 2.0, 4.0, 0.0]]
    assert out.returns is base.returns and out.loss_mask is base.loss_mask
