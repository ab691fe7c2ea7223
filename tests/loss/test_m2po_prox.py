"""M2PO token filter and proximal-logp approximations, with hand-computed numbers."""

import math

import pytest
import torch

from areal_trainer.loss import (
    approximate_prox_logp,
    m2po_mask,
    version_alpha,
)

from .helpers import inputs, loss_fn, loss_inputs, mask_of, t


def m2_inputs(m2_values):
    """behav = -sqrt(m2), prox = 0 -> (behav - prox)^2 = m2."""
    behav = -torch.sqrt(t([m2_values]))
    return behav, torch.zeros_like(behav)


# -- M2PO ---------------------------------------------------------------------------------------

def test_m2po_truth_table():
    # m2 = [0.5, 0.1, 0.02, 0.01], tau = 0.04. Suffix means after dropping the k largest:
    # k=0: 0.63/4 = 0.1575, k=1: 0.13/3 = 0.0433, k=2: 0.03/2 = 0.015 < 0.04 -> k = 2.
    behav, prox = m2_inputs([0.5, 0.1, 0.02, 0.01])
    mask, n = m2po_mask(behav, prox, mask_of([[1, 1, 1, 1]]), threshold=0.04)
    assert mask.tolist() == [[False, False, True, True]] and n.item() == 2


def test_m2po_order_does_not_matter():
    behav, prox = m2_inputs([0.02, 0.5, 0.01, 0.1])
    mask, _ = m2po_mask(behav, prox, mask_of([[1, 1, 1, 1]]), threshold=0.04)
    assert mask.tolist() == [[True, False, True, False]]


def test_m2po_all_above_threshold_keeps_the_smallest():
    # Every suffix mean is >= 0.3 > 0.04: all but the smallest (0.3) are dropped.
    behav, prox = m2_inputs([0.5, 0.3, 0.4])
    mask, n = m2po_mask(behav, prox, mask_of([[1, 1, 1]]), threshold=0.04)
    assert mask.tolist() == [[False, True, False]] and n.item() == 2


def test_m2po_below_threshold_keeps_everything_and_ignores_padding():
    # Valid m2 [0.01, 0.02] (mean 0.015 < 0.04) -> nothing dropped; the padded 9.0 is not counted.
    behav, prox = m2_inputs([0.01, 0.02, 9.0])
    mask, n = m2po_mask(behav, prox, mask_of([[1, 1, 0]]), threshold=0.04)
    assert mask.tolist() == [[True, True, False]] and n.item() == 0


def test_m2po_works_across_rows_and_on_an_empty_mask():
    # Two rows flattened: [0.5, 0.01 | 0.02, pad] -> drop 0.5 (suffix mean 0.015).
    behav = -torch.sqrt(t([[0.5, 0.01], [0.02, 3.0]]))
    mask, _ = m2po_mask(behav, torch.zeros(2, 2), mask_of([[1, 1], [1, 0]]), threshold=0.04)
    assert mask.tolist() == [[False, True], [True, False]]
    empty, n = m2po_mask(behav, torch.zeros(2, 2), mask_of([[0, 0], [0, 0]]), threshold=0.04)
    assert not empty.any() and n.item() == 0


def test_m2po_normalises_by_the_pre_filter_count():
    # 4 tokens, A = 1, ratio 1 (logp = prox = 0), m2 as in the truth table -> 2 kept.
    # Loss = -(1 + 1) / 4 = -0.5 (pre-filter count), not -1 (post-filter count).
    behav, prox = m2_inputs([0.5, 0.1, 0.02, 0.01])
    res = loss_fn(m2_threshold=0.04)(inputs(prox, t([[1.0] * 4]), [[1] * 4], prox=prox, behav=behav))
    assert res.loss.item() == pytest.approx(-0.5)
    assert res.stats["actor/m2po/masked_frac"].item() == pytest.approx(0.5)
    assert res.stats["actor/n_valid_tokens"].item() == 4


# -- proximal approximation ---------------------------------------------------------------------

def test_loglinear_midpoint():
    # v_b = 0, v_theta = 2 -> v_prox = 1, alpha = (1 - 0)/(2 - 0) = 0.5; -1 + 0.5 (-1.5 + 1) = -1.25.
    alpha = version_alpha(torch.tensor([[0]]), 2)
    assert alpha.item() == 0.5
    assert approximate_prox_logp(t([[-1.0]]), t([[-1.5]]), alpha).item() == pytest.approx(-1.25)


def test_loglinear_mixed_versions():
    # v_theta = 4: v_b = 0 -> alpha 3/4; v_b = 2 -> alpha 1/2.
    # old (-1, -2), theta (-1.5, -2.2): -1 + .75(-.5) = -1.375; -2 + .5(-.2) = -2.1.
    alpha = version_alpha(torch.tensor([[0, 2]]), torch.tensor(4))
    assert torch.allclose(alpha, t([[0.75, 0.5]]))
    out = approximate_prox_logp(t([[-1.0, -2.0]]), t([[-1.5, -2.2]]), alpha)
    assert torch.allclose(out, t([[-1.375, -2.1]]))


def test_alpha_zero_cases():
    # v_b = v_prox (=1, v_theta 2) -> 0; v_b = v_theta -> 0 (no division by zero); prompt -1 -> 0.
    assert torch.equal(version_alpha(torch.tensor([[1, 2, -1]]), 2), torch.zeros(1, 3))


def test_linear_and_rollout():
    # Linear with alpha 0.5: log(0.5 * 0.5 + 0.5 * 0.25) = log 0.375. Rollout returns old.
    old, theta = torch.log(t([[0.5]])), torch.log(t([[0.25]]))
    alpha = t([[0.5]])
    assert approximate_prox_logp(old, theta, alpha, method="linear").item() == pytest.approx(math.log(0.375))
    assert torch.equal(approximate_prox_logp(old, theta, alpha, method="rollout"), old)


@pytest.mark.parametrize("method", ["loglinear", "linear", "rollout"])
def test_approximations_are_float32_of_the_input_shape(method):
    out = approximate_prox_logp(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.bfloat16),
                                torch.zeros(2, 3), method=method)
    assert out.shape == (2, 3) and out.dtype == torch.float32


def _no_prox(logp, versions, current_version=2):
    logp = t(logp).requires_grad_()
    return loss_inputs(logp, None, t([[-1.0, -1.0]]), t([[1.0, 1.0]]), mask_of([[1, 1]]),
                       versions=versions, current_version=current_version)


def test_missing_prox_requires_loglinear():
    with pytest.raises(ValueError, match="loglinear"):
        loss_fn(prox_logp_method="recompute", use_decoupled_loss=True)(_no_prox([[-1.5, -1.5]], None))


def test_missing_prox_requires_versions():
    with pytest.raises(ValueError, match="versions"):
        loss_fn(prox_logp_method="loglinear", use_decoupled_loss=True)(_no_prox([[-1.5, -1.5]], None))


def test_loglinear_prox_in_the_loss():
    # Versions 0, v_theta 2: prox = -1 + 0.5 (-1.5 + 1) = -1.25 for both tokens; ratio = exp(-1.5 + 1.25)
    # = e^-0.25 = 0.7788, inside the clip range [0.6, 1.4], so loss = -A r = -0.7788 (A = 1).
    fn = loss_fn(prox_logp_method="loglinear", use_decoupled_loss=True, eps_clip=0.4)
    res = fn(_no_prox([[-1.5, -1.5]], torch.tensor([[0, 0]])))
    assert res.loss.item() == pytest.approx(-math.exp(-0.25), rel=1e-6)
    assert res.stats["actor/prox_approx/alpha"].item() == pytest.approx(0.5)


def test_metrics_mode_logs_every_approximation():
    inp = inputs(t([[-1.5, -2.2]]), t([[1.0, 1.0]]), [[1, 1]], prox=t([[-1.3, -2.0]]), behav=t([[-1.0, -2.0]]),
                 versions=torch.tensor([[0, 2]]), current_version=4)
    res = loss_fn(prox_logp_method="metrics", use_decoupled_loss=True)(inp)
    for m in ("loglinear", "linear", "rollout"):
        for e in ("abs_err", "rel_err", "sq_err", "weight_abs_err"):
            assert f"actor/prox_approx/{m}/{e}" in res.stats
    # loglinear approximations (-1.375, -2.1) vs ground truth (-1.3, -2.0): |err| mean (0.075 + 0.1) / 2.
    assert res.stats["actor/prox_approx/loglinear/abs_err"].item() == pytest.approx(0.0875, rel=1e-5)
    # rollout = old: |(-1) - (-1.3)| and |(-2) - (-2)| -> 0.15.
    assert res.stats["actor/prox_approx/rollout/abs_err"].item() == pytest.approx(0.15, rel=1e-5)


def test_recompute_mode_logs_no_approximation():
    res = loss_fn(use_decoupled_loss=True)(inputs(t([[-1.0]]), t([[1.0]]), [[1]]))
    assert not any(k.startswith("actor/prox_approx") for k in res.stats)


def test_metrics_mode_needs_versions():
    with pytest.raises(ValueError, match="versions"):
        loss_fn(prox_logp_method="metrics", use_decoupled_loss=True)(inputs(t([[-1.0]]), t([[1.0]]), [[1]]))
