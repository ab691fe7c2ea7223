"""The default computation end to end: alignment, pi_old, KL placement per unit, extras."""

import pytest
import torch

from areal_trainer.advantage import AdvantageInputs
from areal_trainer.advantage.align import aligned_mask, masked_shift_left, shift_left
from areal_trainer.components.advantage import bind_advantage

from .helpers import actor, batch, close, norm, run


def test_turn_mode_end_to_end_with_kl():
    # loss_mask [0,1,1,1,1] aligns to [1,1,1,1,0], ids to [0,0,1,1,-1], old logprobs to [0,.2,.4,0,0].
    # KL (k1, kl_ctl 1, ref 0) = [0,-.2,-.4,0,0]. Turn 1 holds the reward 2 (position 3): A_1 = 2, A_0 = 2.
    # Actor advantages add the token's own KL; returns stay task-only.
    data = batch([[0, 1, 1, 1, 1]], [2.0], turn_ids=[[-1, 0, 0, 1, 1]], logprobs=[[0, 0, 0.2, 0.4, 0]],
                 ref_logp=torch.zeros(1, 5))
    out = run(data, actor(kl_ctl=1.0, gae_timestep_unit="turn"))
    close(out.returns, [[2, 2, 2, 2, 0]])
    close(out.advantages, [[2, 1.8, 1.6, 2, 0]])
    close(out.total_rewards, [[0, -0.2, -0.4, 2, 0]])


def test_token_mode_puts_kl_in_the_recursion():
    # Same batch in token mode: rewards [0,-.2,-.4+0,2,0] are summed from the right (gamma = lambda = 1):
    # A = [1.4, 1.4, 1.6, 2, 0]; returns equal them (V = 0), so the KL reaches the returns.
    data = batch([[0, 1, 1, 1, 1]], [2.0], logprobs=[[0, 0, 0.2, 0.4, 0]], ref_logp=torch.zeros(1, 5))
    out = run(data, actor(kl_ctl=1.0))
    close(out.advantages, [[1.4, 1.4, 1.6, 2, 0]])
    close(out.returns, [[1.4, 1.4, 1.6, 2, 0]])


def test_turn_mode_needs_turn_ids():
    with pytest.raises(ValueError, match="requires rollout data to include 'turn_ids'"):
        run(batch([[0, 1, 1]], [1.0]), actor(gae_timestep_unit="turn"))


def test_outcome_broadcast_and_masked_positions_are_zero():
    # gamma = lambda = 1, V = 0, no KL: every active token gets the reward; prompt and padding get 0 (Q15).
    data = batch([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]], [3.0, -1.0], attention_mask=[[1, 1, 1, 1, 0], [1] * 5])
    out = run(data)
    close(out.advantages, [[0, 3, 3, 0, 0], [-1, -1, -1, -1, 0]])
    close(out.loss_mask, [[0, 1, 1, 0, 0], [1, 1, 1, 1, 0]])


def test_pi_old_defaults_to_the_aligned_behaviour_logprobs():
    data = batch([[0, 1, 1]], [1.0], logprobs=[[0, -1.0, -2.0]])
    out = run(data)
    close(out.logprobs, [[-1, -2, 0]])
    assert "prox_logp" not in out.extras  # the proximal policy is decided by train/policies.py


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_one_pass_shift_gives_the_bits_of_shifting_then_masking(dtype):
    # pi_old is shifted, converted and masked in one pass: the same bits as the three steps one after another,
    # negative zeros and NaN included, and detached (pi_old is a constant of the loss).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 33, generator=g, dtype=torch.float64).to(dtype)
    x[0, 3], x[1, 7] = float("nan"), -0.0
    x.requires_grad_(True)
    mask = aligned_mask((torch.rand(5, 33, generator=g) < 0.6).long())
    two_steps = shift_left(x.detach(), 0.0, torch.float32).mul_(mask)
    one_pass = masked_shift_left(x, mask)
    assert one_pass.dtype == torch.float32 and not one_pass.requires_grad
    assert torch.equal(one_pass.view(torch.int32), two_steps.view(torch.int32))


def test_pi_old_given_by_the_trainer_is_used_masked():
    # train/policies.py passes a recomputed pi_old (already aligned); the advantage only masks it.
    data = batch([[0, 1, 1]], [1.0], logprobs=[[0, -1.0, -2.0]])
    out = run(data, actor(recompute_logprob=True), old_logprobs=torch.tensor([[-0.5, -0.7, 5.0]]))
    close(out.logprobs, [[-0.5, -0.7, 0]])


def test_pi_old_enters_the_kl_reward():
    # k1 KL with kl_ctl 1 against ref 0 is -old on active positions.
    data = batch([[0, 1, 1]], [0.0], logprobs=[[0, -1.0, -2.0]], ref_logp=torch.zeros(1, 3))
    out = run(data, actor(kl_ctl=1.0), old_logprobs=torch.tensor([[-0.5, -0.7, 5.0]]))
    close(out.kl_rewards, [[0.5, 0.7, 0]])


def test_integer_rewards_and_untouched_inputs():
    data = batch([[0, 1, 1]], torch.tensor([1], dtype=torch.int64), versions=[[-1, 3, 3]])
    snapshot = {k: v.clone() for k, v in data.items()}
    out = run(data, actor(reward_norm=norm("batch", None)))
    assert out.outcome_rewards.dtype == torch.float32
    for k, v in data.items():
        assert torch.equal(v, snapshot[k])


def test_the_bound_computation_reads_its_settings_not_the_config():
    """Settings are bound once: changing the config object afterwards changes nothing."""
    cfg = actor(adv_norm=norm("batch", "batch"), discount=0.9, gae_lambda=0.8)
    data = batch([[0, 1, 1, 1], [0, 0, 1, 1]], [1.0, 0.0], values=torch.rand(2, 4))
    fn = bind_advantage(cfg)
    a = fn(AdvantageInputs(data, cfg))
    cfg.discount, cfg.reward_scaling, cfg.adv_norm = 0.5, 3.0, None
    b = fn(AdvantageInputs(data, cfg))
    assert not torch.equal(a.advantages, bind_advantage(cfg)(AdvantageInputs(data, cfg)).advantages)
    for name in ("advantages", "returns", "loss_mask", "logprobs", "outcome_rewards", "total_rewards", "kl_rewards"):
        assert torch.equal(getattr(a, name), getattr(b, name))


def test_adv_norm_uses_group_metadata():
    from areal_trainer.advantage import TrajBatchMeta

    cfg = actor(adv_norm=norm("group", None))
    data = batch([[0, 1, 1]] * 3, [1.0, 3.0, 5.0])
    out = run(data, cfg, meta=TrajBatchMeta(traj_group_sizes=(2, 1)))
    # group 1 tokens {1,1,3,3}: mean 2 -> -1, +1; group 2 (one row) centred on itself -> 0
    close(out.advantages, [[-1, -1, 0], [1, 1, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="whole groups"):
        run(data, actor(adv_norm=norm("group", None, group_size=2)))


def test_data_checks():
    data = batch([[0, 1, 1]], [1.0])
    with pytest.raises(ValueError, match="lacks 'logprobs'"):
        run({k: v for k, v in data.items() if k != "logprobs"})
    with pytest.raises(ValueError, match=r"data\['values'\] must have shape \(1, 3\)"):
        run({**data, "values": torch.zeros(1, 2)})
    with pytest.raises(ValueError, match=r"rewards'\] must have shape \(1,\)"):
        run({**data, "rewards": torch.zeros(2)})


def test_all_reduce_reaches_both_normalisations():
    seen = []

    def all_reduce(t):
        seen.append(tuple(t.shape))
        return t

    cfg = actor(reward_norm=norm("batch", "batch"), adv_norm=norm("batch", "batch"))
    run(batch([[0, 1, 1], [0, 1, 0]], [1.0, 0.0]), cfg, all_reduce=all_reduce)
    # reward_norm: [count, sum] then sum of squares; adv_norm: the same pair
    assert seen == [(2,), (), (2,), ()]
