"""On-policy distillation's loss terms against hand-derived numbers: AReaL's joint form (with RL, and pure
distillation's reverse-KL policy gradient), the per-token advantage form (slime, tinker), and MOPD
(reference §6.10: bounded IS weight, unnormalised teacher weights, the coefficients); masked positions
holding ``-inf`` give no NaN in the value or the gradient."""

import math

import pytest
import torch

from areal_trainer.advantage.distill import distill_advantage
from areal_trainer.loss import (
    DistillLoss,
    PolicyLogprobs,
    PolicyLossInputs,
    PolicyLossResult,
    TeacherLogprobs,
)
from areal_trainer.loss.distill import kd_token_loss, mopd_token_loss, reverse_kl_pg_token_loss

INF = float("inf")


def T(rows):
    return torch.tensor(rows, dtype=torch.float32)


MASK = torch.tensor([[True, True, False]])


def rl_stub(value=2.0):
    """An RL loss of a known value whose gradient is 0 (so the distillation term's gradient is all there is)."""
    def loss(inputs, normalizer=None):
        return PolicyLossResult(torch.where(inputs.loss_mask, inputs.logprobs, 0.0).sum() * 0 + value,
                                {"actor/n_valid_tokens": inputs.loss_mask.sum()})
    return loss


def inputs(logp, old, teacher, weight=None, behavior=None, mask=MASK, adv=None):
    logp = logp.clone().requires_grad_(True)
    weight = mask.float() if weight is None else weight
    pol = PolicyLogprobs(behavior=old, teacher=TeacherLogprobs(teacher, weight, behavior))
    return logp, PolicyLossInputs(logprobs=logp, policies=pol, advantages=torch.zeros_like(old) if adv is None else adv,
                                  loss_mask=mask)


LOGP, OLD, TEACHER = T([[-1.0, -2.0, -INF]]), T([[-1.2, -2.0, -INF]]), T([[-0.5, -3.0, -INF]])


def test_joint_form_with_rl_adds_the_kd_term_of_areal():
    # L = w_rl * L_rl + w_d * sum_m (lp - T) / N = 1 * 2 + 0.1 * ((-1 + 0.5) + (-2 + 3)) / 2 = 2.025
    logp, x = inputs(LOGP, OLD, TEACHER)
    out = DistillLoss(rl=rl_stub(), form="joint", rl_weight=1.0, distill_weight=0.1)(x)
    assert out.loss.item() == pytest.approx(2.025, abs=1e-6)
    out.loss.backward()
    # d/dlp of w_d (lp - T) / N = 0.05 on both trained tokens, 0 on the masked one (no NaN from its -inf)
    assert logp.grad[0].tolist() == pytest.approx([0.05, 0.05, 0.0])
    assert out.stats["distill/reverse_kl"].item() == pytest.approx(0.25)  # ((-1 + .5) + (-2 + 3)) / 2
    assert out.stats["distill/teacher_logp"].item() == pytest.approx(-1.75)


def test_joint_form_with_rl_weight_scales_the_rl_loss():
    _, x = inputs(LOGP, OLD, TEACHER)
    out = DistillLoss(rl=rl_stub(2.0), form="joint", rl_weight=0.5, distill_weight=0.0)(x)
    assert out.loss.item() == pytest.approx(1.0)


def test_pure_distillation_is_the_reverse_kl_policy_gradient_with_is():
    # L = -w_d sum_m exp(lp - old) (T - sg(lp)) / N
    logp, x = inputs(LOGP, OLD, TEACHER)
    out = DistillLoss(rl=None, form="joint", rl_weight=0.0, distill_weight=0.5)(x)
    r = math.exp(0.2)
    tok = [-r * (-0.5 + 1.0), -1.0 * (-3.0 + 2.0)]
    assert out.loss.item() == pytest.approx(0.5 * sum(tok) / 2, abs=1e-6)
    out.loss.backward()
    # d/dlp: -exp(lp - old) (T - lp) (the stop-gradient keeps the reward fixed): the per-token reward
    # T - lp weighted by the IS ratio
    assert logp.grad[0].tolist() == pytest.approx([0.5 * tok[0] / 2, 0.5 * tok[1] / 2, 0.0], abs=1e-6)
    assert torch.isfinite(logp.grad).all()
    assert out.stats["actor/importance_ratio/mean"].item() == pytest.approx((r + 1) / 2)
    assert "actor/entropy" not in out.stats  # no entropy given


def test_token_functions_agree_with_the_loss():
    assert kd_token_loss(LOGP, TEACHER, MASK)[0].tolist() == pytest.approx([-0.5, 1.0, 0.0])
    tok = reverse_kl_pg_token_loss(LOGP, OLD, TEACHER, MASK)
    assert tok[0].tolist() == pytest.approx([-math.exp(0.2) * 0.5, 1.0, 0.0])


def test_advantage_form_adds_minus_beta_times_the_log_ratio_at_sampled_tokens():
    adv = T([[1.0, 1.0, 7.0]])
    # A - beta (old - T): 1 - 0.5 (-1.2 + 0.5) = 1.35 ; 1 - 0.5 (-2 + 3) = 0.5 ; masked -> 0
    out = distill_advantage(adv, OLD, TEACHER, MASK, rl_weight=1.0, coef=0.5)
    assert out[0].tolist() == pytest.approx([1.35, 0.5, 0.0])
    pure = distill_advantage(adv, OLD, TEACHER, MASK, rl_weight=0.0, coef=0.5)
    assert pure[0].tolist() == pytest.approx([0.35, -0.5, 0.0])
    # the loss is the RL loss itself (the term is in the advantages)
    _, x = inputs(LOGP, OLD, TEACHER)
    assert DistillLoss(rl=rl_stub(3.0), form="advantage", rl_weight=1.0, distill_weight=0.5)(x).loss.item() == 3.0


# MOPD: two teachers with weights 1 and 0.5 (unnormalised), IS cap 1.5.
T1, T2 = T([[-0.5, -1.0, -INF]]), T([[-3.0, -2.0, -INF]])
W = (1.0, 0.5)
BEHAV = T([[-1.5, -2.0, -INF]])


def _mopd_inputs():
    tsum = torch.where(MASK, W[0] * T1 + W[1] * T2, 0.0)  # [-2, -2]
    wsum = MASK.float() * sum(W)
    return inputs(LOGP, OLD, tsum, weight=wsum, behavior=BEHAV)


def test_mopd_loss_by_hand():
    logp, x = _mopd_inputs()
    loss = DistillLoss(rl=None, form="mopd", rl_weight=0.0, distill_weight=0.1, ratio_cap=1.5)(x)
    # log rho = sg(lp) - behav = [0.5, 0]: the first hits log 1.5 -> rho = [1.5, 1]
    # s = sum_j w_j T_j - (sum_j w_j) lp = [-2 + 1.5, -2 + 3] = [-0.5, 1]
    # l = -rho s = [0.75, -1]; L = 0.1 (0.75 - 1) / 2
    assert loss.loss.item() == pytest.approx(0.1 * (0.75 - 1.0) / 2, abs=1e-6)
    loss.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.1 * 0.75 / 2, 0.1 * -1.0 / 2, 0.0], abs=1e-6)
    assert loss.stats["distill/is_clip_frac"].item() == pytest.approx(0.5)
    assert loss.stats["distill/is_weight"].item() == pytest.approx(1.25)
    tok, rho, clipped = mopd_token_loss(LOGP, BEHAV, x.policies.teacher.logp, x.policies.teacher.weight, MASK,
                                        ratio_cap=1.5)
    assert tok[0].tolist() == pytest.approx([0.75, -1.0, 0.0]) and clipped.tolist() == [[True, False, False]]


@pytest.mark.parametrize("rl,distill,expect", [
    (0.0, 0.1, 0.1 * -0.125),           # distill * L_mopd
    (0.5, 0.0, 0.5 * 2.0),              # rl * L_rl
    (0.5, 0.1, 0.5 * 2.0 + 0.1 * -0.125),  # both
])
def test_mopd_coefficients_combine_the_two_losses(rl, distill, expect):
    _, x = _mopd_inputs()
    out = DistillLoss(rl=rl_stub(2.0), form="mopd", rl_weight=rl, distill_weight=distill, ratio_cap=1.5)(x)
    assert out.loss.item() == pytest.approx(expect, abs=1e-6)


@pytest.mark.parametrize("form,rl", [("joint", 0.0), ("joint", 1.0), ("mopd", 0.0), ("mopd", 1.0), ("advantage", 1.0)])
def test_minus_inf_at_masked_positions_gives_no_nan_in_value_or_gradient(form, rl):
    # Every input -inf (or NaN) where nothing is trained: prompt and padding log-probs.
    bad = T([[-INF, -1.0, float("nan")], [-INF, -INF, -2.0]])
    mask = torch.tensor([[False, True, False], [False, False, True]])
    logp = torch.where(mask, T([[0.0, -1.5, 0.0], [0.0, 0.0, -0.3]]), -INF)

    def rl_loss(x, normalizer=None):
        return PolicyLossResult(torch.where(x.loss_mask, x.logprobs, 0.0).sum(), {})

    lp, x = inputs(logp, bad, bad, weight=mask.float(), behavior=bad, mask=mask)
    out = DistillLoss(rl=rl_loss, form=form, rl_weight=rl, distill_weight=0.3, ratio_cap=5.0)(x)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lp.grad).all(), (out.loss, lp.grad)
    assert all(torch.isfinite(v.value) for v in out.stats.values())
    assert lp.grad[~mask].abs().sum() == 0


def test_distill_loss_without_teacher_logprobs_is_an_error():
    x = PolicyLossInputs(logprobs=LOGP, policies=PolicyLogprobs(behavior=OLD), advantages=OLD * 0, loss_mask=MASK)
    with pytest.raises(ValueError, match="policies.teacher"):
        DistillLoss(rl=rl_stub(), form="joint")(x)


def test_teacher_logprobs_are_sliced_with_the_policies():
    pol = PolicyLogprobs(behavior=T([[1.0, 2.0], [3.0, 4.0]]),
                         teacher=TeacherLogprobs(T([[5.0, 6.0], [7.0, 8.0]]), T([[1.0, 1.0], [1.0, 0.0]])))
    cut = pol.rows(torch.tensor([1]), width=1)
    assert (cut.teacher.logp.tolist() == [[7.0]] and cut.teacher.weight.tolist() == [[1.0]]
            and cut.teacher.behavior is None)
