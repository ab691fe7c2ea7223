"""Outcome rewards: overlong penalty, pipeline order, placement, KL rewards, truncation and
logical rollout references."""

import pytest
import torch

from areal_trainer.advantage import RolloutGroup, TrajBatchMeta
from areal_trainer.advantage.reward import overlong_penalty

from .helpers import T, actor, batch, close, norm, run


def test_overlong_penalty_values():
    # L_max 1024, zone 512, factor 1: free up to 512, then linear to -1 at 1024 (and beyond, unclamped).
    lengths = [400, 768, 1024, 1280]
    mask = torch.zeros(4, 1300)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    out = overlong_penalty(torch.zeros(4), mask, max_new_tokens=1024, overlong_tokens=512, factor=1.0)
    close(out, [0.0, -0.5, -1.0, -1.5])


def test_reward_pipeline_order():
    # (1 + bias -.5) * scale 10 = 5, inside the clip 20.
    out = run(batch([[0, 1, 1]], [1.0]), actor(reward_bias=-0.5, reward_scaling=10.0, reward_clip=20.0))
    close(out.outcome_rewards, [5.0])
    out = run(batch([[0, 1, 1]], [1.0]), actor(reward_bias=-0.5, reward_scaling=10.0, reward_clip=4.0))
    close(out.outcome_rewards, [4.0])  # clip after bias and scale
    # The penalty comes first: 4 generated tokens with L_max 4, zone 4, factor .5 -> -.5;
    # then (1 - .5 + bias .5) * 10 = 10; then clip 20 keeps it; then reward_norm over [10, 20] -> -1/sqrt2, +1/sqrt2.
    cfg = actor(overlong_reward_penalty=True, overlong_tokens=4, overlong_penalty_factor=0.5, max_new_tokens=4,
                reward_bias=0.5, reward_scaling=10.0, reward_norm=norm("batch", "batch", eps=0.0))
    out = run(batch([[0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], [1.0, 1.5]), cfg)
    close(out.metrics["penalized_rewards"], [0.5, 1.5])
    close(out.outcome_rewards, [-(2 ** -0.5), 2 ** -0.5])


def test_raw_rewards_are_never_mutated():
    data = batch([[0, 1, 1, 1]], [1.0])
    before = data["rewards"].clone(), data["rewards"]._version
    cfg = actor(overlong_reward_penalty=True, overlong_tokens=2, overlong_penalty_factor=1.0, max_new_tokens=3)
    out = run(data, cfg)
    assert torch.equal(data["rewards"], before[0]) and data["rewards"]._version == before[1]
    # L = 3 generated tokens, free up to L_max - zone = 1: penalty -(3 - 1)/2 * 1 = -1, so 1 - 1 = 0.
    close(out.metrics["penalized_rewards"], [0.0])


def test_outcome_goes_to_last_active_position():
    # A tool-output tail: loss_mask [0,1,1,0,0] aligns to [1,1,0,0,0]; the reward sits at position 1,
    # not at seqlen - 2 = 3 (which is inactive and would drop it).
    out = run(batch([[0, 1, 1, 0, 0]], [2.0]), actor(discount=1.0))
    close(out.total_rewards, [[0, 2, 0, 0, 0]])
    close(out.advantages, [[2, 2, 0, 0, 0]])


def test_kl_rewards_k1():
    # kl_ctl 1, k1: reward = -(old - ref) at valid aligned positions, 0 at masked ones and at seqlen - 1.
    data = batch([[0, 1, 1, 1, 0]], [0.0], attention_mask=[[1, 1, 1, 1, 0]], logprobs=[[0, -1.0, -2.0, -0.5, 0]],
                 ref_logp=[[-0.5, -1.5, -0.25, 9.0, 9.0]])
    out = run(data, actor(kl_ctl=1.0))
    # aligned old = [-1, -2, -.5, 0, 0]; ref masked = [-.5, -1.5, -.25, 0, 0]
    close(out.kl_rewards, [[0.5, 0.5, 0.25, 0, 0]])
    close(out.logprobs, [[-1, -2, -0.5, 0, 0]])
    close(out.extras["ref_logp"], [[-0.5, -1.5, -0.25, 0, 0]])


def test_no_ref_means_no_kl():
    out = run(batch([[0, 1, 1]], [1.0], logprobs=[[0, -1.0, -1.0]]), actor(kl_ctl=0.5))
    close(out.kl_rewards, torch.zeros(1, 3))


def test_truncation_bootstrap_from_last_valid_token():
    # Row of 4 real tokens in a width-5 batch, responses at tokens 1..3 -> aligned active 0..2.
    # V = [1,2,3,4,9]; bootstrap V[seqlen-1] = V[3] = 4 for a truncated row, gamma = lambda = 1, reward 0:
    # deltas: t2 = 4 - 3 = 1, t1 = 3 - 2 = 1, t0 = 2 - 1 = 1 -> A = [3, 2, 1]; returns A + V = 4.
    common = dict(attention_mask=[[1, 1, 1, 1, 0]], values=[[1.0, 2, 3, 4, 9]])
    out = run(batch([[0, 1, 1, 1, 0]], [0.0], is_truncated=[True], **common))
    close(out.advantages, [[3, 2, 1, 0, 0]])
    close(out.returns, [[4, 4, 4, 4, 9]])
    assert out.extras["is_truncated"].tolist() == [True]
    # Ended with EOS: bootstrap 0 -> deltas -3, 1, 1 -> A = [-1, -2, -3], returns 0.
    out = run(batch([[0, 1, 1, 1, 0]], [0.0], is_truncated=[False], **common))
    close(out.advantages, [[-1, -2, -3, 0, 0]])
    close(out.returns[:, :3], [[0, 0, 0]])


def test_truncation_heuristic_and_flag_checks():
    # Without the flag a row as long as the padded width counts as truncated.
    out = run(batch([[0, 1, 1], [0, 1, 0]], [1.0, 1.0], attention_mask=[[1, 1, 1], [1, 1, 0]]))
    assert out.extras["is_truncated"].tolist() == [True, False]
    with pytest.raises(TypeError, match="is_truncated"):
        run({**batch([[0, 1, 1]], [1.0]), "is_truncated": [True]})
    with pytest.raises(ValueError, match=r"is_truncated'\] must have shape \(1,\)"):
        run({**batch([[0, 1, 1]], [1.0]), "is_truncated": T([True, False])})


def test_mask_no_eos_with_zero_drops_outcome_of_truncated_rows():
    data = batch([[0, 1, 1], [0, 1, 1]], [1.0, 1.0], is_truncated=[True, False])
    out = run(data, actor(mask_no_eos_with_zero=True))
    close(out.advantages, [[0, 0, 0], [1, 1, 0]])


def _split_meta(rewards=()):
    # One prompt, 3 logical rollouts over 4 rows: the first rollout spans rows 0 and 1.
    return TrajBatchMeta(traj_group_sizes=(4,), rollout_groups=(RolloutGroup((2, 1, 1), tuple(rewards)),))


GRPO = dict(reward_norm=norm("group", "group", eps=0.0))


def test_logical_rollouts_one_reference_each():
    # References [1, 0, 1] (the split rollout counted once): mean 2/3, unbiased std sqrt(1/3).
    # Rows: (1 - 2/3)/sqrt(1/3) = .57735 for rows 0, 1, 3; (0 - 2/3)/sqrt(1/3) = -1.1547 for row 2.
    out = run(batch([[0, 1]] * 4, [1.0, 1.0, 0.0, 1.0]), actor(**GRPO), meta=_split_meta())
    close(out.outcome_rewards, [0.57735, 0.57735, -1.1547, 0.57735], atol=1e-4)


def test_logical_rollouts_differing_rows_need_explicit_reward():
    with pytest.raises(ValueError, match="Split rollout row rewards differ"):
        run(batch([[0, 1]] * 4, [1.0, 0.0, 0.0, 1.0]), actor(**GRPO), meta=_split_meta())
    # An explicit reference settles it: references [1, 0, 1] as above; rows keep their own scores.
    out = run(batch([[0, 1]] * 4, [1.0, 0.0, 0.0, 1.0]), actor(**GRPO), meta=_split_meta((1.0, None, None)))
    close(out.outcome_rewards, [0.57735, -1.1547, -1.1547, 0.57735], atol=1e-4)


def test_explicit_references_bypass_the_length_penalty():
    # Rows 0 and 1 (one rollout) are long enough to be penalised differently; their explicit
    # reference (1.0) is unpenalised. References [1, 0, 1]: mean 2/3, std sqrt(1/3).
    cfg = actor(overlong_reward_penalty=True, overlong_tokens=2, overlong_penalty_factor=1.0, max_new_tokens=2,
                **GRPO)
    lm = [[0, 1, 1], [0, 1, 0], [0, 1, 0], [0, 1, 0]]  # row 0: 2 tokens -> penalty -1; others 1 token -> -.5
    out = run(batch(lm, [1.0, 1.0, 0.5, 1.5]), cfg, meta=_split_meta((1.0, None, None)))
    std = (1 / 3) ** 0.5
    # penalised rows [0, .5, 0, 1]; references [1, 0, 1]
    close(out.outcome_rewards, [(0 - 2 / 3) / std, (0.5 - 2 / 3) / std, (0 - 2 / 3) / std, (1 - 2 / 3) / std],
          atol=1e-4)


def test_validity_flag_is_all_reduced_for_batch_levels():
    seen = []

    def all_reduce(t):
        seen.append(t.clone())
        return t

    run(batch([[0, 1]] * 4, [1.0, 1.0, 0.0, 1.0]), actor(reward_norm=norm("batch", "batch")), meta=_split_meta(),
        all_reduce=all_reduce)
    assert seen[0].shape == () and seen[0].item() == 0  # the "some split rows differ" flag, summed over ranks


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators(estimator):
    # delta = old - ref = -1 - (-1.5) = .5: k1 .5, k2 .5**2/2 = .125, k3 exp(-.5) - 1 + .5 = .10653; reward -2 * kl.
    expected = {"k1": 0.5, "k2": 0.125, "k3": 0.1065307}[estimator]
    data = batch([[0, 1, 0]], [0.0], logprobs=[[0, -1.0, 0]], ref_logp=[[-1.5, 3.0, 3.0]])
    out = run(data, actor(kl_ctl=2.0, kl_estimator=estimator))
    close(out.kl_rewards, [[-2 * expected, 0, 0]])
