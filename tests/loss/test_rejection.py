"""Rejection sampling (IcePop, KPop, clamp, KL metrics) with hand-computed numbers.

Tokens are given as log-ratios ``prox - behav`` (behav = 0), so the ratio metric is ``exp(lr)``,
kl_k1 is ``lr``, kl_k2 is ``lr^2 / 2`` and kl_k3 is ``exp(-lr) - 1 + lr``.
"""

import math

import pytest
import torch

from areal_trainer.loss import apply_rejection_sampling, binary_kl
from areal_trainer.loss.rejection import bernoulli_kl, rejection_problems

from .helpers import mask_of, t


def rs(log_ratio, mask=None, **kw):
    lr = t(log_ratio)
    mask = torch.ones_like(lr, dtype=torch.bool) if mask is None else mask_of(mask)
    return apply_rejection_sampling(lr, torch.zeros_like(lr), mask, **kw)


# -- mask mode, ratio ---------------------------------------------------------------------------

def test_ratio_above_upper_is_filtered():
    # e^1 = 2.718 > 2 -> dropped; e^0 = 1 kept.
    out = rs([[1.0, 0.0]], upper=2.0)
    assert out.mask.tolist() == [[False, True]]
    assert out.n_rejected.item() == 1
    assert torch.allclose(out.weight, t([[0.0, 1.0]]))


def test_icepop_band_filters_low_ratios():
    # IcePop [0.5, 5]: ratios e^-1 = 0.37 (drop), 1 (keep), e^1.5 = 4.48 (keep), e^2 = 7.39 (drop).
    out = rs([[-1.0, 0.0, 1.5, 2.0]], lower=0.5, upper=5.0)
    assert out.mask.tolist() == [[False, True, True, False]]


def test_bounds_are_inclusive():
    upper = float(torch.exp(torch.tensor(math.log(2.0))))  # exactly the value the metric computes
    assert rs([[math.log(2.0)]], upper=upper).mask.item()
    assert rs([[0.0]], lower=1.0, upper=2.0).mask.item()  # ratio 1 == lower
    assert rs([[0.5]], metric="kl_k1", upper=0.5).mask.item()  # k1 = 0.5 == upper


def test_sequence_ratio_mean_is_geometric_and_sets_a_uniform_weight():
    # Log-ratios [0, .5, 1]: mean .5 -> every token's weight e^0.5 (kept, upper 5).
    out = rs([[0.0, 0.5, 1.0]], level="sequence", upper=5.0)
    assert out.mask.all()
    assert torch.allclose(out.weight, torch.full((1, 3), math.exp(0.5)))


def test_sequence_ratio_weight_ignores_padding():
    # Row 0: valid log-ratios [0.2, 0.4] -> e^0.3; the padded 5.0 is excluded. Row 1: [0, 0] -> 1.
    out = rs([[0.2, 0.4, 5.0], [0.0, 0.0, 0.0]], [[1, 1, 0], [1, 1, 0]], level="sequence", upper=5.0)
    assert torch.allclose(out.weight, t([[math.exp(0.3), math.exp(0.3), 0.0], [1.0, 1.0, 0.0]]))


def test_sequence_kl_keeps_per_token_weights():
    # kl_k2 of [0, 1, 0] = [0, .5, 0], mean 1/6 <= 1 -> kept; the KL metrics keep per-token weights e^lr.
    out = rs([[0.0, 1.0, 0.0]], level="sequence", metric="kl_k2", upper=1.0)
    assert out.mask.all()
    assert torch.allclose(out.weight, torch.exp(t([[0.0, 1.0, 0.0]])))


def test_sequence_kl_k2_mean_decides_the_whole_row():
    # Row 0: k2 = [0, 0, .5], mean 0.167 < 0.5 -> kept. Row 1: k2 = [.5, .5, 1.0], mean 0.667 > 0.5 -> dropped.
    out = rs([[0.0, 0.0, 1.0], [1.0, 1.0, math.sqrt(2.0)]], level="sequence", metric="kl_k2", upper=0.5)
    assert out.mask.tolist() == [[True] * 3, [False] * 3]
    assert out.n_rejected.item() == 3


def test_padding_does_not_dilute_the_sequence_aggregate():
    # One valid token with k2 = 2^2 / 2 = 2 > 0.5: dropped, though the mean over the full row would be 0.67.
    out = rs([[2.0, 0.0, 0.0]], [[1, 0, 0]], level="sequence", metric="kl_k2", upper=0.5)
    assert not out.mask.any()


# -- clamp mode ---------------------------------------------------------------------------------

def test_clamp_keeps_the_mask_and_clamps_weights():
    # Ratio e^2 = 7.39 -> 5; the others (ratio 1) untouched.
    mask = mask_of([[1, 1, 1, 0]])
    out = apply_rejection_sampling(t([[2.0, 0.0, 0.0, 0.0]]), torch.zeros(1, 4), mask, action="clamp", upper=5.0)
    assert torch.equal(out.mask, mask)
    assert torch.allclose(out.weight, t([[5.0, 1.0, 1.0, 0.0]]))
    assert out.n_clamped.item() == 1 and out.n_rejected.item() == 0


def test_sequence_clamp_clamps_the_geometric_mean():
    # Row 0: log-ratios [1, 1, 2], mean 4/3 -> e^{4/3} = 3.79 > 3 -> every token's weight clamped to 3.
    # Row 1: clean -> weight 1, not clamped.
    out = rs([[1.0, 1.0, 2.0], [0.0, 0.0, 0.0]], level="sequence", action="clamp", upper=3.0)
    assert torch.allclose(out.weight, t([[3.0] * 3, [1.0] * 3]))
    assert out.mask.all() and out.n_clamped.item() == 3


def test_clamp_with_lower_bound():
    # Ratios 0.2, 10, 1 clamped into [0.5, 3] -> 0.5, 3, 1.
    out = rs([[math.log(0.2), math.log(10.0), 0.0]], action="clamp", lower=0.5, upper=3.0)
    assert torch.allclose(out.weight, t([[0.5, 3.0, 1.0]]))


def test_legacy_cap_equivalence():
    # Ratios (1, 7.39, 0.61) with cap 5: mask keeps/drops/keeps; clamp weights (1, 5, 0.61).
    lr = [[0.0, 2.0, -0.5]]
    assert rs(lr, upper=5.0).mask.tolist() == [[True, False, True]]
    assert torch.allclose(rs(lr, action="clamp", upper=5.0).weight, t([[1.0, 5.0, math.exp(-0.5)]]))


def test_clamp_requires_the_ratio_metric():
    problems = rejection_problems("actor.rejection_sampling", level="token", action="clamp", metric="kl_k2",
                                  agg="mean", upper=1.0, lower=None)
    assert problems == ["actor.rejection_sampling.action: action='clamp' only supports metric='ratio' "
                        "(got metric='kl_k2'); use action=mask."]


# -- KL metrics ---------------------------------------------------------------------------------

def test_kl_k1_bounds():
    # Bounds [-0.5, 1]: k1 = -1 dropped, -0.3 kept, 1.5 dropped.
    assert rs([[-1.0, -0.3, 1.5]], metric="kl_k1", lower=-0.5, upper=1.0).mask.tolist() == [[False, True, False]]


def test_kl_k1_sequence_mean():
    # Means: [0, 1, -0.5] -> 0.167 kept; [2, 2, 0] -> 1.333 > 1 dropped.
    out = rs([[0.0, 1.0, -0.5], [2.0, 2.0, 0.0]], level="sequence", metric="kl_k1", lower=-0.5, upper=1.0)
    assert out.mask.tolist() == [[True] * 3, [False] * 3]


def test_kl_k3_values():
    # k3(0.5) = e^-0.5 - 0.5 = 0.1065, k3(-0.5) = e^0.5 - 1.5 = 0.1487 (both kept, upper 1);
    # k3(2) = e^-2 + 1 = 1.1353 > 1 (dropped).
    assert rs([[0.5, -0.5, 2.0]], metric="kl_k3", upper=1.0).mask.tolist() == [[True, True, False]]
    assert rs([[0.5, -0.5]], metric="kl_k3", upper=0.107).mask.tolist() == [[True, False]]


def test_sum_aggregation_is_length_sensitive():
    # k2 of 0.5 is 0.125; four of them sum to 0.5 <= 1 (kept). k2 of 1 is 0.5; four sum to 2 > 1 (dropped).
    out = rs([[0.5] * 4, [1.0] * 4], level="sequence", metric="kl_k2", agg="sum", upper=1.0)
    assert out.mask.tolist() == [[True] * 4, [False] * 4]


def test_max_aggregation_with_ratio():
    # One token at e^2 = 7.39 > 3 rejects its whole row under max; the clean row is kept.
    out = rs([[0.0, 2.0, 0.0], [0.1, 0.1, 0.1]], level="sequence", agg="max", upper=3.0)
    assert out.mask.tolist() == [[False] * 3, [True] * 3]


def test_all_masked_row_under_max_leaves_others_alone():
    out = rs([[0.0, 0.0], [9.0, 9.0], [0.0, 0.1]], [[0, 0], [0, 0], [1, 1]], level="sequence", metric="kl_k2",
             agg="max", upper=1.0)
    assert out.mask.tolist() == [[False, False], [False, False], [True, True]]
    assert torch.equal(out.weight[:2], torch.zeros(2, 2))


# -- KPop (binary KL) ---------------------------------------------------------------------------

def test_binary_kl_example():
    # p = 0.9, q = 0.5: KL(p||q) = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.5290 - 0.1609 = 0.3681;
    # KL(q||p) = 0.5 ln(5/9) + 0.5 ln 5 = -0.2939 + 0.8047 = 0.5108; the metric is the max, 0.5108.
    p, q = torch.tensor(0.9), torch.tensor(0.5)
    assert bernoulli_kl(p, q).item() == pytest.approx(0.3681, abs=1e-4)
    assert bernoulli_kl(q, p).item() == pytest.approx(0.5108, abs=1e-4)
    assert binary_kl(torch.log(p), torch.log(q)).item() == pytest.approx(0.5108, abs=1e-4)
    assert binary_kl(torch.log(q), torch.log(p)).item() == pytest.approx(0.5108, abs=1e-4)


def test_kpop_masks_above_phi():
    # prox p = 0.9, behav q = 0.5 -> 0.5108: dropped with phi 0.5, kept with phi 0.6. Identical probs -> 0.
    prox, behav = torch.log(t([[0.9, 0.3]])), torch.log(t([[0.5, 0.3]]))
    mask = mask_of([[1, 1]])
    drop = apply_rejection_sampling(prox, behav, mask, metric="binary_kl", upper=0.5)
    keep = apply_rejection_sampling(prox, behav, mask, metric="binary_kl", upper=0.6)
    assert drop.mask.tolist() == [[False, True]] and keep.mask.all()
    # The behaviour weight stays per token: p / q = 1.8.
    assert keep.weight[0, 0].item() == pytest.approx(1.8, rel=1e-5)


# -- edge cases ---------------------------------------------------------------------------------

def test_empty_mask():
    out = rs([[3.0, -3.0]], [[0, 0]], upper=2.0)
    assert not out.mask.any() and torch.equal(out.weight, torch.zeros(1, 2))
    assert out.n_rejected.item() == 0


def test_everything_filtered_and_single_token_rows():
    out = rs([[3.0], [4.0]], upper=2.0)
    assert not out.mask.any() and out.n_rejected.item() == 2


def test_negative_infinity_in_both_logprobs_gives_no_nan():
    prox = t([[-math.inf, -1.0]])
    behav = t([[-math.inf, -1.0]])
    for metric in ("ratio", "kl_k1", "kl_k3", "binary_kl"):
        out = apply_rejection_sampling(prox, behav, mask_of([[1, 1]]), metric=metric, upper=2.0)
        assert torch.isfinite(out.weight).all()


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape"):
        apply_rejection_sampling(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2, dtype=torch.bool))


def test_invalid_enum_raises():
    with pytest.raises(ValueError, match="metric"):
        rs([[0.0]], metric="kl_k4")
