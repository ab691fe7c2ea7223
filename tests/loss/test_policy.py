"""The config binder, the decoupled/rejection wiring, the stats contract and the no-host-sync rule."""

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from areal_trainer.components.loss import bind_policy_loss
from areal_trainer.loss import (
    PolicyLossInputs,
    Reduction,
    Stat,
    loss_normalizer,
    reduce_stats,
    value_loss,
)

from .helpers import actor_config, inputs, loss_inputs, mask_of, t

ICEPOP = {"level": "token", "action": "mask", "metric": "ratio", "lower": 0.5, "upper": 5.0}
KPOP = {"level": "token", "action": "mask", "metric": "binary_kl", "upper": 2.0}


def random_inputs(seed=0, b=4, s=6, spread=0.3, **extra):
    g = torch.Generator().manual_seed(seed)
    behav = -torch.rand(b, s, generator=g) * 3
    prox = behav + spread * torch.randn(b, s, generator=g)
    logp = prox + spread * torch.randn(b, s, generator=g)
    adv = torch.randn(b, s, generator=g)
    mask = torch.rand(b, s, generator=g) > 0.25
    return inputs(logp, adv, mask, prox=prox, behav=behav, **extra)


# -- binder -------------------------------------------------------------------------------------

def test_binder_reads_the_surrogate_settings_from_the_actor_keys():
    cfg = actor_config(eps_clip=0.3, eps_clip_higher=0.4, c_clip=2.0, importance_sampling_level="sequence")
    fn = bind_policy_loss(cfg)
    assert fn.surrogate.name == "clip" and fn.importance_sampling_level == "sequence"
    assert dict(fn.surrogate.settings) == {"eps_clip": 0.3, "eps_clip_higher": 0.4, "c_clip": 2.0}
    assert torch.equal(fn(random_inputs()).loss, bind_policy_loss(cfg)(random_inputs()).loss)
    sapo = bind_policy_loss(actor_config(use_sapo_loss=True, sapo_tau_neg=2.0))
    assert sapo.surrogate.name == "sapo" and dict(sapo.surrogate.settings) == {"sapo_tau_pos": 1.0, "sapo_tau_neg": 2.0}


def test_binder_skips_rejection_sampling_without_the_decoupled_loss():
    # lower = 2 on the ratio would mask every token if RS compared prox = old with itself.
    cfg = actor_config(use_decoupled_loss=False, rejection_sampling={"lower": 2.0, "upper": 5.0})
    fn = bind_policy_loss(cfg)
    assert fn.rejection is None
    res = fn(random_inputs())
    assert res.loss.item() != 0.0
    assert not any(k.startswith("actor/rejection") for k in res.stats)
    assert torch.equal(res.loss, bind_policy_loss(actor_config())(random_inputs()).loss)


def test_binder_clamp_without_lower_clamps_from_zero():
    cfg = actor_config(use_decoupled_loss=True, rejection_sampling={"action": "clamp", "upper": 5.0})
    assert bind_policy_loss(cfg).rejection.lower == 0.0
    assert cfg.rejection_sampling.lower is None  # the config object is not mutated


def test_binder_rejects_sapo_with_decoupled_loss():
    cfg = actor_config(validate=False, use_sapo_loss=True, use_decoupled_loss=True)
    with pytest.raises(ValueError, match="SAPO is not compatible"):
        bind_policy_loss(cfg)


def test_binder_rejects_bad_values_that_skipped_validation():
    cfg = actor_config(validate=False, c_clip=1.0)
    with pytest.raises(ValueError, match="c_clip"):
        bind_policy_loss(cfg)


# -- decoupled loss -----------------------------------------------------------------------------

def test_decoupled_without_rejection_applies_no_behaviour_weight():
    # prox - behav = ln 2 (w = 2) but without rejection_sampling only r = pi_theta / pi_prox = 1 matters:
    # loss = -A = -1.
    inp = inputs(t([[0.0]]), t([[1.0]]), [[1]], prox=t([[0.0]]), behav=t([[-math.log(2.0)]]))
    res = bind_policy_loss(actor_config(use_decoupled_loss=True))(inp)
    assert res.loss.item() == pytest.approx(-1.0)
    assert res.stats["actor/behave_approx_kl"].item() == pytest.approx(math.log(2.0))


def test_decoupled_with_icepop_weights_and_masks():
    # Token 0: w = 2 (kept, in [0.5, 5]) -> loss -2 * A = -2. Token 1: w = e^-1 = 0.37 < 0.5 -> dropped.
    # Token mean over the pre-filter count 2: (-2 + 0) / 2 = -1. Ratio r = 1 throughout.
    prox = t([[0.0, 0.0]])
    inp = inputs(prox, t([[1.0, 1.0]]), [[1, 1]], prox=prox, behav=t([[-math.log(2.0), 1.0]]))
    res = bind_policy_loss(actor_config(use_decoupled_loss=True, rejection_sampling=ICEPOP))(inp)
    assert res.loss.item() == pytest.approx(-1.0, rel=1e-6)
    assert res.stats["actor/rejection/masked_frac"].item() == pytest.approx(0.5)
    assert res.stats["actor/behave_weight/max"].item() == pytest.approx(2.0, rel=1e-6)
    assert res.stats["actor/behave_weight"].item() == pytest.approx(1.0, rel=1e-6)  # (2 + 0) / 2


def test_decoupled_with_kpop():
    # Token 0: prox p = 0.9, behav q = 0.5 -> binary KL 0.51 <= 2 kept. Token 1: p = 0.999, q = 0.001 ->
    # KL ~ 6.9 > 2 dropped. Loss = -(w0 * 1) / 2 with w0 = 0.9 / 0.5 = 1.8 -> -0.9.
    prox = torch.log(t([[0.9, 0.999]]))
    inp = inputs(prox, t([[1.0, 1.0]]), [[1, 1]], prox=prox, behav=torch.log(t([[0.5, 0.001]])))
    res = bind_policy_loss(actor_config(use_decoupled_loss=True, rejection_sampling=KPOP))(inp)
    assert res.loss.item() == pytest.approx(-0.9, rel=1e-5)


def test_dual_clip_then_behaviour_weight():
    # A = -1, r = 5: dual-clipped loss 3, times w = 2 (clamp mode keeps it) -> 6.
    inp = inputs(t([[math.log(5.0)]]), t([[-1.0]]), [[1]], prox=t([[0.0]]), behav=t([[-math.log(2.0)]]))
    cfg = actor_config(use_decoupled_loss=True, c_clip=3.0, rejection_sampling={"action": "clamp", "upper": 5.0})
    assert bind_policy_loss(cfg)(inp).loss.item() == pytest.approx(6.0, rel=1e-5)


# -- stats --------------------------------------------------------------------------------------

ALL_ON = dict(use_decoupled_loss=True, rejection_sampling=ICEPOP, c_clip=3.0, m2_threshold=0.04)


def test_stats_are_detached_zero_dim_and_namespaced():
    inp = random_inputs(entropy=torch.rand(4, 6), versions=torch.zeros(4, 6, dtype=torch.long), current_version=3)
    res = bind_policy_loss(actor_config(**ALL_ON))(inp)
    expected = {
        "actor/n_valid_tokens", "actor/loss/normalizer", "actor/loss/normalizer_used/max", "actor/token_loss",
        "actor/importance_ratio/mean", "actor/importance_ratio/min", "actor/importance_ratio/max",
        "actor/approx_kl", "actor/prox_nonfinite_frac", "actor/clip_frac", "actor/clip_frac_low",
        "actor/clip_frac_high", "actor/dual_clip_frac", "actor/m2po/masked_frac", "actor/m2po/m2",
        "actor/behave_approx_kl", "actor/behave_ratio/min", "actor/behave_ratio/max",
        "actor/rejection/masked_frac", "actor/behave_weight", "actor/behave_weight/min",
        "actor/behave_weight/max", "actor/entropy", "actor/staleness", "actor/staleness/max",
    }
    assert set(res.stats) == expected
    for k, v in res.stats.items():
        assert isinstance(v, Stat) and v.value.dim() == 0 and not v.value.requires_grad, k
        assert v.weight is None or v.weight.dim() == 0 and not v.weight.requires_grad, k
    assert res.stats["actor/staleness"].item() == pytest.approx(3.0)
    assert res.stats["actor/n_valid_tokens"].item() == inp.loss_mask.sum().item()


def test_sapo_stats():
    res = bind_policy_loss(actor_config(use_sapo_loss=True))(random_inputs())
    assert {"actor/sapo/gate", "actor/sapo/gate_pos", "actor/sapo/gate_neg"} <= set(res.stats)
    assert not any("clip_frac" in k for k in res.stats)


def test_every_statistic_is_made_with_the_reduction_its_name_promises():
    """The reductions are declared where each statistic is made (``Stat``); the names follow the documented
    convention: extremes under ``/min`` and ``/max``, the counts summed, every other key a mean over the
    micro-batch's pre-filter tokens, weighted by them."""
    inp = random_inputs(entropy=torch.rand(4, 6), versions=torch.zeros(4, 6, dtype=torch.long), current_version=3)
    stats = bind_policy_loss(actor_config(**ALL_ON, prox_logp_method="metrics"))(inp).stats
    _, critic = value_loss(torch.rand(4, 6), torch.rand(4, 6), torch.rand(4, 6), inp.loss_mask, 0.5)
    for k, v in {**stats, **critic}.items():
        if k.endswith(("/min", "/max")):
            assert v.reduction == k.rsplit("/", 1)[1] and v.weight is None, k
        elif k.endswith(("/n_valid_tokens", "/loss/normalizer")):
            assert v.reduction is Reduction.SUM and v.weight is None, k
        else:
            n = stats["actor/n_valid_tokens"] if k.startswith("actor/") else critic["critic/n_valid_tokens"]
            assert v.reduction is Reduction.MEAN and v.weight.item() == n.item() == inp.loss_mask.sum().item(), k
    assert stats["actor/behave_weight/min"].reduction is Reduction.MIN
    assert stats["actor/loss/normalizer_used/max"].reduction is Reduction.MAX


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_reduced_micro_batch_stats_equal_full_batch_stats(mode):
    # Everything row-local (no M2PO): reducing the stats of 4 micro-batches reproduces the full batch.
    cfg = actor_config(use_decoupled_loss=True, rejection_sampling=ICEPOP, c_clip=3.0, loss_agg_mode=mode)
    fn = bind_policy_loss(cfg)
    full = random_inputs(seed=3, b=8, spread=1.0, entropy=torch.rand(8, 6))
    parts = [slice(0, 1), slice(1, 4), slice(4, 6), slice(6, 8)]
    n = sum(loss_normalizer(full.loss_mask[p], mode) for p in parts)
    mbs = [fn(_rows(full, p), normalizer=n) for p in parts]
    reduced = reduce_stats([m.stats for m in mbs])
    whole = fn(full).stats
    assert set(reduced) == set(whole)
    for k in whole:
        assert reduced[k].reduction is whole[k].reduction, k
        assert torch.allclose(reduced[k].value, whole[k].value, atol=1e-6), k
        if whole[k].weight is not None:  # a mean keeps the tokens it averages over
            assert reduced[k].weight.item() == whole[k].weight.item(), k
    assert torch.allclose(sum(m.loss for m in mbs), fn(full).loss, atol=1e-6)


def _rows(inp, rows):
    def cut(x):
        return None if x is None or not isinstance(x, torch.Tensor) or x.dim() == 0 else x[rows]
    return PolicyLossInputs(
        logprobs=inp.logprobs[rows], policies=inp.policies.rows(rows), advantages=inp.advantages[rows],
        loss_mask=inp.loss_mask[rows], entropy=cut(inp.entropy))


def test_value_stats_follow_the_convention():
    _, stats = value_loss(torch.rand(2, 3), torch.rand(2, 3), torch.rand(2, 3), mask_of([[1, 1, 0], [1, 0, 0]]), 0.5)
    assert all(k.startswith("critic/") and v.value.dim() == 0 for k, v in stats.items())
    assert stats["critic/n_valid_tokens"].item() == 3


# -- no host synchronisation --------------------------------------------------------------------

class ForbidHostSync(TorchFunctionMode):
    """Fails on any tensor operation that needs the device's data on the host."""

    BANNED = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero",
              "masked_select", "unique", "unique_consecutive", "argwhere", "equal", "allclose", "is_nonzero"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in self.BANNED:
            raise AssertionError(f"host sync: {name}")
        if name in ("__getitem__", "__setitem__") and len(args) > 1:
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx):
                raise AssertionError("host sync: boolean-mask indexing")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        ALL_ON,
        dict(use_decoupled_loss=True, rejection_sampling=dict(level="sequence", action="clamp", agg="max")),
        dict(use_decoupled_loss=True, rejection_sampling=KPOP, prox_logp_method="metrics"),
        dict(use_decoupled_loss=True, prox_logp_method="loglinear"),
        dict(use_sapo_loss=True, importance_sampling_level="sequence", loss_agg_mode="seq-mean-token-sum-norm"),
    ],
)
def test_no_host_sync_in_the_loss_path(cfg):
    fn = bind_policy_loss(actor_config(**cfg))
    extra = dict(entropy=torch.rand(4, 6), versions=torch.zeros(4, 6, dtype=torch.long), current_version=2)
    inp = random_inputs(**extra)
    if cfg.get("prox_logp_method") == "loglinear":
        inp = loss_inputs(inp.logprobs, None, inp.policies.behavior, inp.advantages, inp.loss_mask, **extra)
    with ForbidHostSync():
        res = fn(inp, normalizer=torch.tensor(40.0))
        res.loss.backward()
        value_loss(torch.rand(4, 6, requires_grad=True), torch.rand(4, 6), torch.rand(4, 6), inp.loss_mask, 0.5)
        reduce_stats([res.stats, res.stats])
