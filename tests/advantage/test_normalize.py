"""NormConfig normalisation: the reference's behavioural cases, leave-one-out, unbiased std, masks,
variable-size groups and the data-parallel hook."""

import dataclasses
import math

import pytest
import torch

from areal_trainer.advantage.normalize import normalize
from areal_trainer.config import NormConfig

from .helpers import T, close, norm

X23 = T([[1.0, 2, 3], [4, 5, 6]])


def test_defaults_and_config_errors():
    cfg = NormConfig()
    assert (cfg.mean_level, cfg.std_level, cfg.group_size, cfg.mean_leave1out, cfg.std_unbiased, cfg.eps) == (
        "batch", "batch", 1, False, True, 1e-5)
    assert NormConfig().check("actor.adv_norm") == []
    assert "actor.adv_norm.mean_level: got 'foo'" in NormConfig(mean_level="foo").check("actor.adv_norm")[0]
    assert "std_level" in NormConfig(std_level="rows").check("actor.adv_norm")[0]
    assert "group_size" in NormConfig(mean_level="group", group_size=0).check("actor.adv_norm")[0]
    custom = NormConfig(mean_level="group", std_level=None, group_size=4, mean_leave1out=True, eps=1e-6)
    assert NormConfig(**dataclasses.asdict(custom)) == custom


def test_batch_batch_with_partial_mask_changes_values():
    mask = T([[1, 1, 0], [1, 1, 1]])
    out = normalize(X23, mask, norm("batch", "batch"))
    assert not torch.allclose(out, X23) and out[0, 2] == 0


def test_group_group_and_mixed_levels():
    x = T([[1.0], [2], [5], [9]])
    out = normalize(x, None, norm("group", "group", group_size=2))
    # [1, 2]: mean 1.5, unbiased std sqrt(.5); [5, 9]: mean 7, std sqrt(8) -> every output is +-1/sqrt(2).
    close(out, [[-0.70710], [0.70710], [-0.70710], [0.70710]], atol=1e-4)
    mixed = normalize(x, None, norm("batch", "group", group_size=2))
    assert torch.isfinite(mixed).all() and not torch.allclose(mixed, out)


def test_none_none_is_identity_and_mean_only_centres():
    close(normalize(X23, None, norm(None, None)), X23)
    out = normalize(X23, None, norm("batch", None))
    assert abs(out.mean().item()) < 1e-6
    full = normalize(X23, None, norm("batch", "batch"))  # no mask: every element counts
    assert abs(full.mean().item()) < 1e-6 and full.std().item() == pytest.approx(1.0, rel=1e-4)


def test_all_zero_input_and_dtype():
    out = normalize(torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3), norm("batch", "batch"))
    assert out.dtype == torch.float32 and torch.equal(out, torch.zeros(2, 3))


def test_all_reduce_is_used_for_batch_statistics():
    calls = []

    def all_reduce(t):
        calls.append(t.clone())
        return t

    normalize(X23, None, norm("batch", "batch"), all_reduce=all_reduce)
    # one fused [count, sum], then the sum of squares around the reduced mean
    assert [tuple(c.shape) for c in calls] == [(2,), ()]
    close(calls[0], [6, 21])
    calls.clear()
    normalize(X23, None, norm("group", "group", group_size=1), all_reduce=all_reduce)
    assert calls == []  # group statistics are local


def test_all_reduce_sums_ranks():
    # Two ranks with rows [1, 2] and [3, 4]: each rank must centre by the global mean 2.5.
    other = T([2.0, 7.0])  # the other rank's [count=2, sum=7], then its sum of squares (3-2.5)^2+(4-2.5)^2 = 2.5

    def all_reduce(t):
        return t + (other if t.dim() else T(2.5))

    out = normalize(T([1.0, 2.0]), None, norm("batch", "batch", eps=0.0), all_reduce=all_reduce)
    std = math.sqrt(5 / 3)  # unbiased over 1, 2, 3, 4
    close(out, [-1.5 / std, -0.5 / std])


@pytest.mark.parametrize("x,expected", [
    ([[1.0], [2], [3], [4]], [[-2], [-2 / 3], [2 / 3], [2]]),  # 1 - 9/3, 2 - 8/3, ...
    ([[10.0], [20], [30]], [[-15], [0], [15]]),                # 10 - 50/2, ...
    ([[5.0]], [[5]]),                                          # a lone element: LOO mean 0
    ([[0.0, 0, 0], [0, 0, 1]], [[-0.2] * 3, [-0.2, -0.2, 1]]),  # 0 - 1/5; 1 - 0/5
])
def test_batch_leave_one_out(x, expected):
    close(normalize(T(x), None, norm("batch", None, mean_leave1out=True)), expected)


def test_leave_one_out_element():
    out = normalize(X23, None, norm("batch", None, mean_leave1out=True))
    assert out[0, 0].item() == pytest.approx(1 - 20 / 5)


def test_masked_leave_one_out():
    # effective {1, 2, 4, 5, 6}, sum 18: element 1 -> 1 - 17/4; masked -> 0.
    out = normalize(X23, T([[1, 1, 0], [1, 1, 1]]), norm("batch", None, mean_leave1out=True))
    assert out[0, 0].item() == pytest.approx(1 - 17 / 4)
    assert out[0, 2].item() == 0


def test_masked_leave_one_out_single_valid_passes_through():
    mask = T([[1, 0, 0], [0, 0, 0]])
    out = normalize(X23, mask, norm("batch", "batch", mean_leave1out=True))  # mean 0, std 1
    assert out[0, 0].item() == pytest.approx(1.0, rel=1e-4)


def test_all_zero_mask_returns_input():
    close(normalize(X23, torch.zeros(2, 3), norm("batch", "batch")), X23)


def test_singleton_group_leave_one_out_is_zero():
    # Upstream semantics (Q19): a lone member is its own baseline -> 0; its std is 1.
    out = normalize(T([[3.0], [-2.0]]), None, norm("group", "group", group_size=1, mean_leave1out=True))
    close(out, [[0], [0]])


@pytest.mark.parametrize("x", [[[1.0], [2], [3]], [[0.0], [1], [2]]])
def test_unbiased_vs_biased_spread(x):
    biased = normalize(T(x), None, norm("batch", "batch", std_unbiased=False, eps=0.0))
    unbiased = normalize(T(x), None, norm("batch", "batch", eps=0.0))
    assert (biased.std() / unbiased.std()).item() == pytest.approx(math.sqrt(3 / 2))


def test_identical_and_single_values_are_finite():
    close(normalize(torch.full((4, 1), 3.0), None, norm("batch", "batch")), torch.zeros(4, 1))
    assert torch.isfinite(normalize(T([[5.0]]), None, norm("batch", "batch"))).all()


def test_masked_batch_normalisation():
    x = torch.arange(1.0, 10.0).reshape(3, 3)
    mask = torch.ones(3, 3)
    mask[0, 2] = mask[1, 1] = mask[2, 0] = 0  # drops 3, 5, 7: effective {1,2,4,6,8,9}, mean 5
    out = normalize(x, mask, norm("batch", "batch"))
    assert torch.equal(out[mask == 0], torch.zeros(3))
    valid = out[mask == 1]
    assert abs(valid.mean().item()) < 1e-6 and valid.std().item() == pytest.approx(1.0, rel=1e-4)
    # deviations -4,-3,-1,1,3,4: sum of squares 52, unbiased std sqrt(52/5)
    assert out[0, 0].item() == pytest.approx(-4 / math.sqrt(52 / 5), rel=1e-4)


@pytest.mark.parametrize("scale", [1e6, 1e-6])
def test_stability(scale):
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0)) * scale + scale
    assert torch.isfinite(normalize(x, None, norm("batch", "batch"))).all()
    close(normalize(torch.full((3, 2), 7.0), None, norm("batch", "batch")), torch.zeros(3, 2))


def test_variable_group_sizes_4_3_4():
    # Three prompts with 4, 3 and 4 surviving rows: each group is centred and scaled on its own.
    x = T([1.0, 0, 0, 1, 1, 1, 0, 5, 6, 7, 8])
    out = normalize(x, None, norm("group", "group"), group_sizes=[4, 3, 4])
    for lo, hi in ((0, 4), (4, 7), (7, 11)):
        g = out[lo:hi]
        assert abs(g.sum().item()) < 1e-5
        assert g.std().item() == pytest.approx(1.0, rel=1e-3)
    # a fixed stride of 4 would have mixed prompts 2 and 3
    assert not torch.allclose(out, normalize(x[:8], None, norm("group", "group", group_size=4)).repeat(2)[:11])


def test_group_size_errors():
    cfg = norm("group", "group", group_size=4)
    with pytest.raises(ValueError, match="whole groups of group_size=4"):
        normalize(torch.zeros(11), None, cfg)
    with pytest.raises(ValueError, match="group_sizes must be all positive"):
        normalize(torch.zeros(4), None, cfg, group_sizes=[4, 0])
    with pytest.raises(ValueError, match=r"group_sizes sum \(5\) must equal batch size \(4\)"):
        normalize(torch.zeros(4), None, cfg, group_sizes=[2, 3])


def test_group_token_weighted_with_member_counts():
    # 2-D group statistics weigh tokens; a group with one member (logical rollout) comes out 0 with LOO.
    x = T([[1.0, 3.0], [2.0, 2.0], [5.0, 7.0]])
    out = normalize(x, None, norm("group", None, mean_leave1out=True), group_sizes=[2, 1], member_counts=[2, 1])
    close(out[2], [0, 0])
    assert out[0, 0].item() == pytest.approx(1 - (3 + 2 + 2) / 3)
