"""Hand-computed values of the ratios and surrogates: PPO clip, asymmetric clip, dual clip, SAPO, GSPO."""

import math

import pytest
import torch

from areal_trainer.loss import (
    clip_ratio,
    clipped_surrogate,
    dual_clip,
    sapo_surrogate,
    sequence_mean_advantage,
    sequence_ratio,
)
from areal_trainer.loss.surrogate import clip_problems, sapo_problems

from .helpers import inputs, loss_fn, mask_of, t

GSPO = loss_fn(importance_sampling_level="sequence")
PPO = loss_fn()


# -- GSPO -------------------------------------------------------------------------------------

def test_gspo_ratio_is_the_geometric_mean():
    # Row 0: log-ratios 1 - 0.5 = 0.5 on every token -> exp(mean) = e^0.5; row 1: 2 - 1 = 1 -> e^1.
    logp = t([[1, 1, 1, 1], [2, 2, 2, 2]])
    prox = t([[0.5] * 4, [1.0] * 4])
    ratio = sequence_ratio(logp, prox, mask_of([[1] * 4] * 2))
    assert torch.allclose(ratio[0], torch.full((4,), math.exp(0.5)))
    assert torch.allclose(ratio[1], torch.full((4,), math.e))


def test_gspo_geometric_mean_of_unequal_tokens_and_masked_zero():
    # Log-ratios [0, 1, 2, (masked 9)] -> mean over the 3 valid tokens = 1 -> ratio e on each, 0 at the pad.
    logp = t([[0, 1, 2, 9]])
    ratio = sequence_ratio(logp, torch.zeros(1, 4), mask_of([[1, 1, 1, 0]]))
    assert torch.allclose(ratio, t([[math.e, math.e, math.e, 0.0]]))


def test_gspo_advantage_averaging_gives_minus_1_5():
    # Ratio 1. Sequence means of the advantages: (1+2+3+4)/4 = 2.5 and 0.5.
    # Per-token loss -A_seq * 1: four tokens of -2.5 and four of -0.5; token mean (-10 - 2) / 8 = -1.5.
    adv = t([[1, 2, 3, 4], [0.5] * 4])
    logp = t([[-1.0] * 4, [-2.0] * 4])
    loss, _ = GSPO(inputs(logp, adv, [[1] * 4] * 2))
    assert loss.item() == pytest.approx(-1.5)
    assert torch.allclose(sequence_mean_advantage(adv, mask_of([[1] * 4] * 2)), t([[2.5] * 4, [0.5] * 4]))


def test_gspo_ignores_masked_advantages():
    # Advantage 10 at the pad must not enter the sequence mean: (1+2+3)/3 = 2 -> loss -2.
    base = GSPO(inputs(t([[-1, -1, -1, -1]]), t([[1, 2, 3, 0]]), [[1, 1, 1, 0]])).loss
    padded = GSPO(inputs(t([[-1, -1, -1, -1]]), t([[1, 2, 3, 10]]), [[1, 1, 1, 0]])).loss
    assert base.item() == pytest.approx(-2.0) and padded.item() == pytest.approx(-2.0)


def test_sequence_and_token_levels_differ_on_non_uniform_data():
    logp, prox = t([[0.1, -0.3, 0.2]]), t([[0.0, 0.0, 0.0]])
    adv, mask = t([[1.0, -2.0, 0.5]]), [[1, 1, 1]]
    tok = PPO(inputs(logp, adv, mask, prox=prox)).loss
    seq = GSPO(inputs(logp, adv, mask, prox=prox)).loss
    assert not torch.isclose(tok, seq)


def test_invalid_importance_sampling_level():
    with pytest.raises(ValueError, match="importance_sampling_level: got 'turn'; must be one of 'token', 'sequence'"):
        loss_fn(importance_sampling_level="turn")


# -- PPO clip -----------------------------------------------------------------------------------

def test_symmetric_clip_bounds_and_log_ratio_two():
    # Log-ratio +2 (r = 7.39) with A = +1 is clipped at 1.2 -> loss -1.2 (high clip);
    # log-ratio -2 (r = 0.135) with A = -1 is clipped at 0.8 -> loss +0.8 (low clip).
    ratio = torch.exp(t([[2.0, -2.0]]))
    loss, low, high = clipped_surrogate(ratio, t([[1.0, -1.0]]), eps_low=0.2, eps_high=0.2)
    assert torch.allclose(loss, t([[-1.2, 0.8]]))
    assert high.tolist() == [[True, False]] and low.tolist() == [[False, True]]


def test_asymmetric_clip_bounds():
    # DAPO clip-higher: eps_low 0.2, eps_high 0.28 -> ratio clamped into [0.8, 1.28].
    assert torch.allclose(clip_ratio(t([[0.5, 1.0, 1.5]]), eps_low=0.2, eps_high=0.28), t([[0.8, 1.0, 1.28]]))
    # A = +1, r = 1.5: max(-1.5, -1.28) = -1.28.  A = -1, r = 0.5: max(0.5, 0.8) = 0.8.
    # A = +1, r = 0.5: max(-0.5, -0.8) = -0.5 (unclipped: PPO only clips in the improving direction).
    loss, low, high = clipped_surrogate(t([[1.5, 0.5, 0.5]]), t([[1.0, -1.0, 1.0]]), eps_low=0.2, eps_high=0.28)
    assert torch.allclose(loss, t([[-1.28, 0.8, -0.5]]))
    assert high.tolist() == [[True, False, False]] and low.tolist() == [[False, True, False]]


def test_asymmetric_clip_in_the_full_loss():
    # One token, A = +1, logp - prox = ln 1.5: loss = -min(1.5, 1.28) = -1.28 with eps_high 0.28,
    # and -1.2 with the symmetric default.
    lp = t([[math.log(1.5)]])
    asym = loss_fn(eps_clip=0.2, eps_clip_higher=0.28)(inputs(lp, t([[1.0]]), [[1]], prox=t([[0.0]])))
    sym = PPO(inputs(lp, t([[1.0]]), [[1]], prox=t([[0.0]])))
    assert asym.loss.item() == pytest.approx(-1.28, rel=1e-6)
    assert sym.loss.item() == pytest.approx(-1.2, rel=1e-6)
    assert asym.stats["actor/clip_frac_high"].item() == 1.0


# -- dual clip ----------------------------------------------------------------------------------

def test_dual_clip_example():
    # A = -1, r = 5, eps = 0.2: l1 = -A r = 5, l2 = -A * 1.2 = 1.2, max = 5; cap c|A| = 3 < 5 -> l = 3.
    loss, _, _ = clipped_surrogate(t([[5.0]]), t([[-1.0]]), eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx(5.0)
    capped, dual = dual_clip(loss, t([[-1.0]]), c_clip=3.0)
    assert capped.item() == pytest.approx(3.0) and dual.item()


def test_dual_clip_in_the_full_loss_and_positive_advantages_untouched():
    # Token 0 is the example above (loss 3, dual-clipped); token 1 has A = +1, r = 5 -> -1.2 (high clip).
    # Token mean (3 - 1.2) / 2 = 0.9.
    fn = loss_fn(eps_clip=0.2, c_clip=3.0)
    res = fn(inputs(t([[math.log(5.0), math.log(5.0)]]), t([[-1.0, 1.0]]), [[1, 1]], prox=t([[0.0, 0.0]])))
    assert res.loss.item() == pytest.approx(0.9, rel=1e-6)
    assert res.stats["actor/dual_clip_frac"].item() == pytest.approx(0.5)


def test_dual_clip_rejects_c_not_above_one():
    assert clip_problems("actor", eps_clip=0.2, c_clip=1.0) == [
        "actor.c_clip: got 1.0; must be > 1 or null (the dual-clip constant, 3.0 is usual; null disables it)."]
    with pytest.raises(ValueError, match="c_clip: got 0.5"):
        loss_fn(c_clip=0.5)


# -- SAPO -----------------------------------------------------------------------------------------

def test_sapo_known_value():
    # r = 1, A = 1, tau = 1: gate = (4/1) * sigmoid(0) = 2, loss = -2 * 1 = -2.
    loss, gate, _, _ = sapo_surrogate(t([[1.0]]), t([[1.0]]), tau_pos=1.0, tau_neg=1.0)
    assert gate.item() == pytest.approx(2.0) and loss.item() == pytest.approx(-2.0)
    res = loss_fn(use_sapo_loss=True, sapo_tau_pos=1.0)(inputs(t([[-0.7]]), t([[1.0]]), [[1]]))
    assert res.loss.item() == pytest.approx(-2.0)
    assert res.stats["actor/sapo/gate"].item() == pytest.approx(2.0)


def test_sapo_gate_selection_by_advantage_sign():
    # r = 1.5 everywhere, tau_pos = 1, tau_neg = 2:
    # positive gate (4/1) sigmoid(0.5) = 2.4898; negative gate (4/2) sigmoid(1.0) = 1.4621.
    # A = 0 takes the negative gate.
    ratio = torch.full((1, 3), 1.5)
    _, gate, _, _ = sapo_surrogate(ratio, t([[1.0, -1.0, 0.0]]), tau_pos=1.0, tau_neg=2.0)
    pos, neg = 4 * torch.sigmoid(torch.tensor(0.5)), 2 * torch.sigmoid(torch.tensor(1.0))
    assert torch.allclose(gate, torch.stack([pos, neg, neg]).unsqueeze(0))
    assert pos.item() == pytest.approx(2.4898, abs=1e-4) and neg.item() == pytest.approx(1.4621, abs=1e-4)


def test_sapo_ratio_uses_the_behaviour_policy():
    # prox differs from behav, but SAPO ignores prox: r = exp(logp - behav) = 1 -> loss -2 (tau 1, A 1).
    res = loss_fn(use_sapo_loss=True)(inputs(t([[-1.0]]), t([[1.0]]), [[1]], prox=t([[-3.0]]), behav=t([[-1.0]])))
    assert res.loss.item() == pytest.approx(-2.0)


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_sapo_rejects_non_positive_tau(tau):
    assert sapo_problems("actor", sapo_tau_pos=1.0, sapo_tau_neg=tau) == [
        f"actor.sapo_tau_neg: got {tau}; must be > 0 (a SAPO gate temperature)."]
    with pytest.raises(ValueError, match=r"sapo_tau_neg: got .*; must be > 0"):
        loss_fn(use_sapo_loss=True, sapo_tau_neg=tau)


def test_sapo_gradient_at_ratio_one_is_independent_of_tau():
    # d/dlogp [-(4/tau) sigmoid(tau (r - 1)) A] = -A * 4 sigmoid'(0) * r = -A at r = 1, for any tau;
    # token mean over 3 valid tokens -> -A / 3.
    adv, mask = t([[1.0, -2.0, 0.5, 7.0]]), [[1, 1, 1, 0]]
    grads = []
    for tau in (1.0, 2.0):
        inp = inputs(t([[-0.5, -1.0, -2.0, -3.0]]), adv, mask)
        loss_fn(use_sapo_loss=True, sapo_tau_pos=tau, sapo_tau_neg=tau)(inp).loss.backward()
        grads.append(inp.logprobs.grad)
    assert torch.allclose(grads[0], grads[1])
    assert torch.allclose(grads[0], t([[-1 / 3, 2 / 3, -0.5 / 3, 0.0]]))


def test_sapo_masked_mean():
    # mask [T, T, F, F]: loss = -sum over the first two of 4 sigmoid(r - 1) A / 2 (tau 1).
    logp, behav = t([[0.2, -0.1, 3.0, 3.0]]), torch.zeros(1, 4)
    adv = t([[1.0, 2.0, 5.0, 5.0]])
    res = loss_fn(use_sapo_loss=True, sapo_tau_pos=1.0)(inputs(logp, adv, [[1, 1, 0, 0]], behav=behav))
    r = torch.exp(logp[0, :2])
    expected = -(4 * torch.sigmoid(r - 1) * adv[0, :2]).sum() / 2
    assert res.loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_sapo_with_decoupled_loss_is_rejected():
    with pytest.raises(ValueError, match="SAPO is not compatible"):
        loss_fn(use_sapo_loss=True, use_decoupled_loss=True)


# -- edge cases ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [PPO, GSPO, loss_fn(use_sapo_loss=True), loss_fn(c_clip=3.0)])
def test_all_masked_gives_zero_loss_and_zero_grad(fn):
    inp = inputs(t([[-1.0, -2.0]]), t([[3.0, -3.0]]), [[0, 0]], prox=t([[0.0, 0.0]]))
    res = fn(inp)
    assert res.loss.item() == 0.0 and res.loss.dtype == torch.float32 and res.loss.dim() == 0
    res.loss.backward()
    assert torch.equal(inp.logprobs.grad, torch.zeros(1, 2))
    assert res.stats["actor/n_valid_tokens"].item() == 0
    assert res.stats["actor/importance_ratio/min"].item() == math.inf


def test_repeated_calls_are_deterministic():
    g = torch.Generator().manual_seed(0)
    logp, prox, adv = (torch.randn(3, 5, generator=g) for _ in range(3))
    mask = torch.rand(3, 5, generator=g) > 0.3
    a = PPO(inputs(logp, adv, mask, prox=prox)).loss
    b = PPO(inputs(logp, adv, mask, prox=prox)).loss
    assert torch.equal(a, b)


def test_inputs_shape_mismatch_raises():
    with pytest.raises(ValueError, match="advantages"):
        inputs(t([[0.0, 0.0]]), t([[1.0]]), [[1, 1]])
    with pytest.raises(ValueError, match=r"\[B, S\]"):
        inputs(torch.zeros(3), torch.zeros(3), torch.ones(3))


# -- CISPO ----------------------------------------------------------------------------------------

def test_cispo_hand_derived():
    # Token 0: logp - base = 0.5, r = e^0.5 = 1.6487, A = +1, eps_high 0.28: weight min(r, 1.28) = 1.28,
    #   loss -1.28 * 1 * 0.5 = -0.64, gradient d/dlogp = -1.28 (kept, unlike PPO's clipped token).
    # Token 1: logp - base = -2, r = e^-2 = 0.1353, A = -1, eps_low 0.2: weight 0.8,
    #   loss -0.8 * (-1) * (-2) = -1.6, gradient +0.8.
    # Token mean: (-0.64 - 1.6) / 2 = -1.12; gradients halved: -0.64, +0.4.
    fn = loss_fn(eps_clip=0.2, eps_clip_higher=0.28, loss={"surrogate": {"implementation": "cispo"}})
    inp = inputs(t([[0.5, -2.0]]), t([[1.0, -1.0]]), [[1, 1]], prox=t([[0.0, 0.0]]))
    res = fn(inp)
    res.loss.backward()
    assert res.loss.item() == pytest.approx(-1.12, rel=1e-6)
    assert torch.allclose(inp.logprobs.grad, t([[-0.64, 0.4]]), atol=1e-6)
    assert res.stats["actor/cispo/clip_frac"].item() == 1.0
    assert res.stats["actor/cispo/weight"].item() == pytest.approx((1.28 + 0.8) / 2, rel=1e-6)


def test_cispo_at_ratio_one_is_reinforce():
    fn = loss_fn(loss={"surrogate": {"implementation": "cispo"}})
    inp = inputs(t([[-1.0, -2.0]]), t([[0.5, -1.5]]), [[1, 1]])
    fn(inp).loss.backward()
    assert torch.allclose(inp.logprobs.grad, t([[-0.25, 0.75]]), atol=1e-6)  # -A / n_tokens
