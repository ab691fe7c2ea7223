"""Invariants of the advantage computation on random small batches (hypothesis)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_trainer.advantage import TrajBatchMeta
from areal_trainer.advantage.gae import token_level_gae, turn_level_gae

from .helpers import actor, norm, run
from .reference import token_gae_loop, turn_gae_loop

SETTINGS = settings(max_examples=25, deadline=None)
group_sizes = st.lists(st.integers(1, 4), min_size=1, max_size=5)


def _batch(seed: int, n_rows: int, width: int, *, p_active: float = 0.7) -> dict:
    """Random right-padded rows: a prompt token, responses with tool gaps, random padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (n_rows,), generator=g)
    attn = (torch.arange(width)[None, :] < lengths[:, None]).long()
    lm = ((torch.rand(n_rows, width, generator=g) < p_active) & attn.bool()).long()
    lm[:, 0] = 0
    return {
        "input_ids": torch.zeros(n_rows, width, dtype=torch.long), "attention_mask": attn, "loss_mask": lm,
        "logprobs": torch.zeros(n_rows, width), "rewards": torch.randn(n_rows, generator=g),
        "values": torch.randn(n_rows, width, generator=g), "is_truncated": torch.rand(n_rows, generator=g) < 0.5,
    }


def _meta(sizes):
    return TrajBatchMeta(traj_group_sizes=tuple(sizes))


def _bounds(sizes):
    out, lo = [], 0
    for s in sizes:
        out.append((lo, lo + s))
        lo += s
    return out


@SETTINGS
@given(sizes=group_sizes, seed=st.integers(0, 10_000), std=st.sampled_from([None, "group", "batch"]))
def test_group_normalised_rewards_sum_to_zero(sizes, seed, std):
    data = _batch(seed, sum(sizes), 6)
    out = run(data, actor(reward_norm=norm("group", std)), meta=_meta(sizes))
    for lo, hi in _bounds(sizes):
        assert abs(out.outcome_rewards[lo:hi].sum().item()) < 1e-4


@SETTINGS
@given(sizes=group_sizes, seed=st.integers(0, 10_000), shift=st.floats(-5, 5), std=st.sampled_from([None, "group"]))
def test_constant_shift_of_a_group_changes_nothing(sizes, seed, shift, std):
    data = _batch(seed, sum(sizes), 6)
    cfg = actor(reward_norm=norm("group", std))
    before = run(data, cfg, meta=_meta(sizes))
    lo, hi = _bounds(sizes)[seed % len(sizes)]
    shifted = data["rewards"].clone()
    shifted[lo:hi] += shift
    after = run({**data, "rewards": shifted}, cfg, meta=_meta(sizes))
    assert torch.allclose(before.advantages, after.advantages, atol=1e-4)


@SETTINGS
@given(sizes=group_sizes, seed=st.integers(0, 10_000), unit=st.sampled_from(["token", "turn"]))
def test_permuting_rows_within_a_group_permutes_the_output(sizes, seed, unit):
    data = _batch(seed, sum(sizes), 7)
    data["turn_ids"] = torch.where(data["loss_mask"].bool(), torch.arange(7).expand(sum(sizes), 7) // 3, -1)
    perm = torch.cat([lo + torch.randperm(hi - lo, generator=torch.Generator().manual_seed(seed))
                      for lo, hi in _bounds(sizes)])
    cfg = actor(reward_norm=norm("group", "group"), adv_norm=norm("group", "batch"), gae_timestep_unit=unit,
                discount=0.9, gae_lambda=0.7)
    out = run(data, cfg, meta=_meta(sizes))
    permuted = run({k: v[perm] for k, v in data.items()}, cfg, meta=_meta(sizes))
    assert torch.allclose(out.advantages[perm], permuted.advantages, atol=1e-4)
    assert torch.allclose(out.returns[perm], permuted.returns, atol=1e-4)


@SETTINGS
@given(n_rows=st.integers(1, 5), width=st.integers(2, 9), seed=st.integers(0, 10_000))
def test_outcome_is_broadcast_with_unit_discount(n_rows, width, seed):
    data = _batch(seed, n_rows, width)
    data.pop("values")
    out = run(data)
    m = out.loss_mask.bool()
    expected = data["rewards"][:, None].expand_as(m)
    assert torch.allclose(out.advantages[m], expected[m], atol=1e-5)
    assert torch.all(out.advantages[~m] == 0)


@SETTINGS
@given(n_rows=st.integers(1, 5), width=st.integers(2, 9), seed=st.integers(0, 10_000),
       discount=st.floats(0, 1), lam=st.floats(0, 1))
def test_one_token_turns_equal_token_mode(n_rows, width, seed, discount, lam):
    data = _batch(seed, n_rows, width)
    lm = data["loss_mask"].bool()
    data["turn_ids"] = torch.where(lm, lm.long().cumsum(-1) - 1, -1)  # every generated token its own turn
    token = run(data, actor(discount=discount, gae_lambda=lam))
    turn = run(data, actor(discount=discount, gae_lambda=lam, gae_timestep_unit="turn"))
    assert torch.allclose(token.advantages, turn.advantages, atol=1e-5)
    assert torch.allclose(token.returns, turn.returns, atol=1e-5)


@SETTINGS
@given(n_rows=st.integers(1, 5), width=st.integers(2, 9), seed=st.integers(0, 10_000),
       unit=st.sampled_from(["token", "turn"]))
def test_values_at_masked_positions_do_not_matter(n_rows, width, seed, unit):
    data = _batch(seed, n_rows, width)
    data["turn_ids"] = torch.where(data["loss_mask"].bool(), torch.arange(width).expand(n_rows, width) // 2, -1)
    cfg = actor(discount=0.9, gae_lambda=0.8, gae_timestep_unit=unit)
    out = run(data, cfg)
    m = out.loss_mask.bool()
    # Free positions: inactive after alignment and not the bootstrap position V[b, seqlen_b - 1].
    seqlen = data["attention_mask"].sum(-1)
    free = ~m
    free[torch.arange(n_rows), seqlen - 1] = False
    noisy = data["values"] + torch.where(free, 100.0, 0.0)
    again = run({**data, "values": noisy}, cfg)
    assert torch.allclose(out.advantages, again.advantages, atol=1e-4)
    assert torch.allclose(out.returns[m], again.returns[m], atol=1e-4)


@SETTINGS
@given(n_rows=st.integers(1, 4), width=st.integers(1, 140), seed=st.integers(0, 10_000),
       discount=st.floats(0, 1), lam=st.one_of(st.floats(0, 1), st.just("row")))
def test_fast_kernels_equal_loops(n_rows, width, seed, discount, lam):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(n_rows, width, generator=g) < 0.6
    r, v = torch.randn(n_rows, width, generator=g), torch.randn(n_rows, width, generator=g)
    boot = torch.randn(n_rows, generator=g)
    lam = torch.rand(n_rows, generator=g) if lam == "row" else lam
    ids = torch.where(m, (torch.rand(n_rows, width, generator=g) < 0.2).long().cumsum(-1).clamp(max=width - 1), -1)
    for fast, slow in ((token_level_gae(r, v, m, boot, discount=discount, gae_lambda=lam),
                        token_gae_loop(r, v, m, boot, discount=discount, gae_lambda=lam)),
                       (turn_level_gae(r, v, m, ids, boot, discount=discount, gae_lambda=lam),
                        turn_gae_loop(r, v, m, ids, boot, discount=discount, gae_lambda=lam))):
        for a, b in zip(fast, slow):
            assert torch.allclose(a.double(), b, atol=1e-4)
