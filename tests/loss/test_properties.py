"""Property tests of the policy loss (hypothesis; small shapes)."""

from __future__ import annotations

import os

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_trainer.loss import (
    PolicyLossInputs,
    RejectionSettings,
    apply_rejection_sampling,
    clip_ratio,
    clipped_surrogate,
    loss_normalizer,
    m2po_mask,
    sequence_mean_advantage,
)
from areal_trainer.loss.m2po import second_moment

from .helpers import loss_fn, loss_inputs

# LOSS_PROPERTY_EXAMPLES=1000 runs a deeper search than the default quick one.
SETTINGS = settings(max_examples=int(os.environ.get("LOSS_PROPERTY_EXAMPLES", "30")), deadline=None)

ICEPOP = RejectionSettings(lower=0.5, upper=5.0)
RS_VARIANTS = [
    ICEPOP,
    RejectionSettings(metric="binary_kl", upper=0.3),
    RejectionSettings(level="sequence", metric="kl_k3", agg="max", upper=0.2),
    RejectionSettings(level="sequence", agg="sum", upper=2.0, lower=0.5),
    RejectionSettings(action="clamp", upper=1.5),  # clamps from 0
    RejectionSettings(level="sequence", action="clamp", upper=1.2, lower=0.9),
]

# Loss settings whose gradient at ratio 1 (logp = prox = behav) must be the REINFORCE gradient.
AT_RATIO_ONE = [
    dict(),
    dict(c_clip=3.0),
    dict(eps_clip=0.2, eps_clip_higher=0.28),
    dict(use_sapo_loss=True, sapo_tau_pos=0.5, sapo_tau_neg=3.0),
    dict(importance_sampling_level="sequence"),
    dict(importance_sampling_level="sequence", use_sapo_loss=True),
    dict(use_decoupled_loss=True, rejection=ICEPOP),
]

# Everything, for the invariance properties (M2PO is micro-batch-global, so not in SPLITTABLE).
SPLITTABLE = AT_RATIO_ONE + [
    dict(use_decoupled_loss=True, rejection=rs, c_clip=2.0) for rs in RS_VARIANTS
] + [dict(use_decoupled_loss=True, rejection=RS_VARIANTS[3], importance_sampling_level="sequence")]
EVERYTHING = SPLITTABLE + [
    dict(m2_threshold=0.04),
    dict(use_decoupled_loss=True, rejection=ICEPOP, m2_threshold=0.01, importance_sampling_level="sequence"),
    dict(use_decoupled_loss=True, prox_logp_method="loglinear", rejection=RS_VARIANTS[1]),
]
AGG_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def build(seed: int, b: int, s: int, *, ratio_one: bool = False, spread: float = 0.5, mask=None, versions=False):
    """Random ``[b, s]`` inputs; ``ratio_one`` makes logp = prox = behav."""
    g = torch.Generator().manual_seed(seed)
    behav = -torch.rand(b, s, generator=g) * 3 - 0.01
    prox = behav if ratio_one else behav + spread * torch.randn(b, s, generator=g)
    logp = prox if ratio_one else prox + spread * torch.randn(b, s, generator=g)
    adv = torch.randn(b, s, generator=g)
    if mask is None:
        mask = torch.rand(b, s, generator=g) > 0.3
    extra = {}
    if versions:
        extra = dict(versions=torch.randint(-1, 3, (b, s), generator=g), current_version=3)
    return loss_inputs(logp.clone().requires_grad_(), prox.clone(), behav.clone(), adv, mask, **extra)


def run(fn, inp: PolicyLossInputs, normalizer=None):
    res = fn(inp, normalizer=normalizer)
    (grad,) = torch.autograd.grad(res.loss, inp.logprobs, allow_unused=False)
    return res, grad


def fn_of(kwargs: dict, mode: str = "token-mean") :
    return loss_fn(loss_agg_mode=mode, max_new_tokens=7, **kwargs)


shapes = dict(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 4), s=st.integers(1, 6))


@SETTINGS
@given(variant=st.sampled_from(AT_RATIO_ONE), **shapes)
def test_gradient_at_ratio_one_is_reinforce(variant, seed, b, s):
    # d loss / d logp_t = -A_t / N on valid tokens (GSPO: the sequence-mean advantage), 0 elsewhere.
    inp = build(seed, b, s, ratio_one=True)
    _, grad = run(fn_of(variant), inp)
    mask = inp.loss_mask
    adv = inp.advantages
    if variant.get("importance_sampling_level") == "sequence":
        adv = sequence_mean_advantage(adv, mask)
    expected = torch.where(mask, -adv / mask.sum().clamp_min(1), 0.0)
    assert torch.allclose(grad, expected, atol=1e-6, rtol=1e-5)


@SETTINGS
@given(
    log_ratio=st.lists(st.floats(-5, 5), min_size=1, max_size=8),
    adv=st.floats(-3, 3),
    eps_low=st.floats(0.0, 0.95),
    eps_high=st.floats(0.0, 3.0),
)
def test_clipped_ratio_stays_in_bounds(log_ratio, adv, eps_low, eps_high):
    ratio = torch.exp(torch.tensor([log_ratio]))
    clipped = clip_ratio(ratio, eps_low=eps_low, eps_high=eps_high)
    assert (clipped >= 1 - eps_low - 1e-6).all() and (clipped <= 1 + eps_high + 1e-6).all()
    a = torch.full_like(ratio, adv)
    loss, low, high = clipped_surrogate(ratio, a, eps_low=eps_low, eps_high=eps_high)
    # Pessimistic bound: never below the unclipped surrogate; where the clip binds, the effective ratio is a bound.
    assert (loss >= -a * ratio - 1e-6).all()
    assert (torch.allclose(loss[low], (-a * (1 - eps_low))[low])
            and torch.allclose(loss[high], (-a * (1 + eps_high))[high]))


@SETTINGS
@given(variant=st.sampled_from(EVERYTHING), mode=st.sampled_from(AGG_MODES),
       garbage=st.sampled_from([1e6, -1e6, float("inf"), float("-inf"), float("nan")]), **shapes)
def test_masked_positions_never_matter(variant, mode, garbage, seed, b, s):
    loglinear = variant.get("prox_logp_method") == "loglinear"
    clean = build(seed, b, s, versions=True)
    mask = clean.loss_mask

    def dirty(x):
        return torch.where(mask, x, garbage)

    versions = clean.policies.versions
    noisy = loss_inputs(
        dirty(clean.logprobs.detach()).requires_grad_(), dirty(clean.policies.proximal),
        dirty(clean.policies.behavior), dirty(clean.advantages), mask, versions=versions, current_version=3)
    if loglinear:
        clean, noisy = (loss_inputs(i.logprobs, None, i.policies.behavior, i.advantages, mask,
                                    versions=versions, current_version=3) for i in (clean, noisy))
    fn = fn_of(variant, mode)
    (res_a, grad_a), (res_b, grad_b) = run(fn, clean), run(fn, noisy)
    assert torch.equal(res_a.loss, res_b.loss)
    assert torch.equal(grad_a, grad_b)
    assert torch.equal(grad_b[~mask], torch.zeros_like(grad_b[~mask]))
    for k in res_a.stats:
        a, b = res_a.stats[k].value, res_b.stats[k].value
        assert torch.equal(a, b) or (a.isnan() and b.isnan()), k


@SETTINGS
@given(variant=st.sampled_from(SPLITTABLE), mode=st.sampled_from(AGG_MODES), seed=st.integers(0, 2**31 - 1),
       b=st.integers(4, 8), s=st.integers(1, 5), data=st.data())
def test_micro_batch_split_is_exact(variant, mode, seed, b, s, data):
    cuts = sorted(data.draw(st.lists(st.integers(1, b - 1), min_size=3, max_size=3, unique=True)))
    bounds = [0, *cuts, b]
    full = build(seed, b, s, spread=1.0)
    fn = fn_of(variant, mode)
    whole, grad_whole = run(fn, full)

    parts = [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    norm = sum(loss_normalizer(full.loss_mask[p], mode) for p in parts)
    logp = full.logprobs.detach().clone().requires_grad_()
    total = 0.0
    for p in parts:
        mb = PolicyLossInputs(logp[p], full.policies.rows(p), full.advantages[p], full.loss_mask[p])
        total = total + fn(mb, normalizer=norm).loss
    total.backward()
    assert torch.allclose(total, whole.loss, atol=1e-6, rtol=1e-5)
    assert torch.allclose(logp.grad, grad_whole, atol=1e-6, rtol=1e-5)


@SETTINGS
@given(sapo=st.booleans(), mode=st.sampled_from(AGG_MODES), data=st.data(), **shapes)
def test_gspo_with_one_token_per_sequence_is_token_level(sapo, mode, data, seed, b, s):
    cols = data.draw(st.lists(st.integers(0, s - 1), min_size=b, max_size=b))
    mask = torch.zeros(b, s, dtype=torch.bool)
    mask[torch.arange(b), torch.tensor(cols)] = True
    inp = build(seed, b, s, spread=1.0, mask=mask)
    tok, grad_tok = run(fn_of(dict(use_sapo_loss=sapo), mode), inp)
    seq, grad_seq = run(fn_of(dict(use_sapo_loss=sapo, importance_sampling_level="sequence"), mode), inp)
    assert torch.allclose(tok.loss, seq.loss, atol=1e-6, rtol=1e-6)
    assert torch.allclose(grad_tok, grad_seq, atol=1e-6, rtol=1e-6)


@SETTINGS
@given(rs=st.sampled_from(RS_VARIANTS), **shapes)
def test_rejection_only_removes_tokens(rs, seed, b, s):
    inp = build(seed, b, s, spread=1.0)
    out = apply_rejection_sampling(inp.policies.proximal, inp.policies.behavior, inp.loss_mask, level=rs.level,
                                   action=rs.action, metric=rs.metric, upper=rs.upper, lower=rs.lower, agg=rs.agg)
    assert not (out.mask & ~inp.loss_mask).any()
    assert torch.equal(out.weight[~out.mask], torch.zeros_like(out.weight[~out.mask]))
    assert (out.weight >= 0).all() and torch.isfinite(out.weight).all()
    if rs.action == "clamp":
        assert torch.equal(out.mask, inp.loss_mask)
    assert out.n_rejected.item() == (inp.loss_mask & ~out.mask).sum().item()


@SETTINGS
@given(tau=st.floats(0.001, 1.0), **shapes)
def test_m2po_drops_the_fewest_largest_tokens(tau, seed, b, s):
    inp = build(seed, b, s, spread=0.4)
    mask = inp.loss_mask
    kept, n_dropped = m2po_mask(inp.policies.behavior, inp.policies.proximal, mask, threshold=tau)
    assert not (kept & ~mask).any()
    m2 = second_moment(inp.policies.behavior, inp.policies.proximal, mask)
    values = sorted(m2[mask].tolist(), reverse=True)
    n, k = len(values), int(n_dropped.item())
    assert k == (mask & ~kept).sum().item()
    if n == 0:
        assert k == 0
        return
    assert k <= n - 1  # at least one token survives
    if kept.any() and (mask & ~kept).any():
        assert m2[mask & ~kept].min() >= m2[kept].max()  # the dropped ones are the largest
    rest = values[k:]
    assert sum(rest) / len(rest) < tau * (1 + 1e-5) or k == n - 1
    if k > 0:  # dropping one fewer would not have been enough (or the fallback applies)
        prev = values[k - 1:]
        assert sum(prev) / len(prev) >= tau * (1 - 1e-5) or k == n - 1
