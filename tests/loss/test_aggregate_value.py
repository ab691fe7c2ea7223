"""Aggregation modes, the global normaliser, and the clipped value loss, with hand-computed numbers."""

import pytest
import torch

from areal_trainer.loss import (
    Reduction,
    RejectionSettings,
    Stat,
    aggregate_loss,
    declared,
    explained_variance,
    loss_normalizer,
    reduce_stats,
    value_loss,
)
from areal_trainer.loss.aggregate import aggregation_problems

from .helpers import inputs, loss_fn, mask_of, t

# Three rows: lengths 3, 1 and 0 (an all-padding row never counts as a sequence).
TOKEN_LOSS = t([[1, 2, 3, 0], [4, 0, 0, 0], [0, 0, 0, 0]])
MASK = mask_of([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected", "units"),
    [
        ("token-mean", 2.5, 4),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq-mean-token-mean", 3.0, 2),  # (6/3 + 4/1) / 2 sequences
        ("seq-mean-token-sum", 5.0, 2),  # (6 + 4) / 2
        ("seq-mean-token-sum-norm", 0.625, 2),  # (6/8 + 4/8) / 2 with max_new_tokens = 8
    ],
)
def test_modes_by_hand(mode, expected, units):
    loss, norm = aggregate_loss(TOKEN_LOSS, MASK, mode=mode, max_new_tokens=8)
    assert loss.item() == pytest.approx(expected)
    assert norm.item() == units
    assert loss_normalizer(MASK, mode).item() == units


def test_global_normaliser_is_used_as_given():
    # Token sum 10 over a global count of 20 tokens -> 0.5; the sequence sum (2 + 4) over 6 sequences -> 1.
    assert aggregate_loss(TOKEN_LOSS, MASK, mode="token-mean", normalizer=20)[0].item() == pytest.approx(0.5)
    got, norm = aggregate_loss(TOKEN_LOSS, MASK, mode="seq-mean-token-mean", normalizer=torch.tensor(6.0))
    assert got.item() == pytest.approx(1.0) and norm.item() == 6.0


def test_empty_step_gives_zero_not_nan():
    for mode in ("token-mean", "seq-mean-token-mean"):
        loss, norm = aggregate_loss(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), mode=mode)
        assert loss.item() == 0.0 and norm.item() == 1.0
    assert loss_normalizer(torch.zeros(2, 3), "token-mean").item() == 0.0


def test_invalid_mode_and_missing_max_new_tokens_are_configuration_errors():
    with pytest.raises(ValueError, match="loss_agg_mode: got 'sum'; must be one of 'token-mean'"):
        loss_fn(loss_agg_mode="sum")
    assert aggregation_problems("actor", loss_agg_mode="seq-mean-token-sum-norm", max_new_tokens=None) == [
        "actor.loss_agg_mode='seq-mean-token-sum-norm' needs actor.max_new_tokens > 0; got None."]
    assert aggregation_problems("actor", loss_agg_mode="token-mean", max_new_tokens=None) == []


def test_two_micro_batches_sum_to_the_full_aggregate():
    # Split rows {0} and {1, 2}. Token-mean with global 4: 6/4 + 4/4 = 2.5; seq-mean-token-mean with
    # global 2: (6/3)/2 + (4/1)/2 = 3.
    for mode, full in (("token-mean", 2.5), ("seq-mean-token-mean", 3.0)):
        n = loss_normalizer(MASK[:1], mode) + loss_normalizer(MASK[1:], mode)
        parts = [aggregate_loss(TOKEN_LOSS[s], MASK[s], mode=mode, normalizer=n)[0] for s in (slice(0, 1), slice(1, 3))]
        assert sum(parts).item() == pytest.approx(full)


def test_rejected_tokens_keep_counting_in_sequence_lengths():
    # Row of 2 tokens, A = 1, ratio 1; IcePop drops token 1 (prox - behav = 3 -> ratio 20 > 5).
    # seq-mean-token-mean: the row's mean divides by its pre-filter length 2: (-1 * w) / 2 with w = 1 -> -0.5.
    fn = loss_fn(use_decoupled_loss=True, loss_agg_mode="seq-mean-token-mean",
                      rejection=RejectionSettings())
    res = fn(inputs(t([[0.0, 3.0]]), t([[1.0, 1.0]]), [[1, 1]], prox=t([[0.0, 3.0]]), behav=t([[0.0, 0.0]])))
    assert res.loss.item() == pytest.approx(-0.5)
    assert res.stats["actor/rejection/masked_frac"].item() == pytest.approx(0.5)


def test_dr_grpo_normaliser_in_the_policy_loss():
    # Ratio 1; rows of 3 and 1 tokens with A = 1: token sums -3 and -1, each / 16, mean over 2 rows -> -0.125.
    fn = loss_fn(loss_agg_mode="seq-mean-token-sum-norm", max_new_tokens=16)
    res = fn(inputs(torch.zeros(2, 3), torch.ones(2, 3), [[1, 1, 1], [1, 0, 0]]))
    assert res.loss.item() == pytest.approx(-0.125)
    assert res.stats["actor/loss/normalizer"].item() == 2


# -- value loss -----------------------------------------------------------------------------------

def test_value_clip_example():
    # v_old = 0, v = 1, R = 1, eps = 0.5: v_clip = 0 + clamp(1, -.5, .5) = 0.5;
    # l = max(0.5 (1-1)^2, 0.5 (0.5-1)^2) = max(0, 0.125) = 0.125, clipped. The clipped branch is flat
    # in v (the clamp saturates), so the gradient is 0.
    v = t([[1.0]]).requires_grad_()
    loss, stats = value_loss(v, t([[0.0]]), t([[1.0]]), mask_of([[1]]), eps_clip=0.5)
    assert loss.item() == pytest.approx(0.125)
    assert stats["critic/clip_frac"].item() == 1.0
    loss.backward()
    assert v.grad.item() == 0.0


def test_value_unclipped_and_masked():
    # Token 0: v = 0.2 within 0.5 of v_old = 0 -> l = 0.5 (0.2 - 1)^2 = 0.32, gradient (v - R) = -0.8.
    # Token 1 is masked (garbage values must not matter); token mean over 1 token.
    v = t([[0.2, 100.0]]).requires_grad_()
    loss, stats = value_loss(v, t([[0.0, -50.0]]), t([[1.0, 7.0]]), mask_of([[1, 0]]), eps_clip=0.5)
    assert loss.item() == pytest.approx(0.32)
    assert stats["critic/clip_frac"].item() == 0.0 and stats["critic/n_valid_tokens"].item() == 1
    loss.backward()
    assert torch.allclose(v.grad, t([[-0.8, 0.0]]))


def test_value_loss_normaliser_and_dtype():
    # 0.32 summed over 1 token, divided by a global count of 4 -> 0.08; float64 inputs give a float32 loss.
    v = torch.tensor([[0.2]], dtype=torch.float64)
    loss, stats = value_loss(v, v * 0, v * 0 + 1, mask_of([[1]]), eps_clip=0.5, normalizer=4)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(0.08)
    assert stats["critic/loss/normalizer_used/max"].item() == 4


def test_explained_variance():
    # Returns [1, 2, 3, 4] (variance 1.25). Old values equal -> 1. Old values [1, 2, 3, 3]: residual
    # [0, 0, 0, 1], variance 0.1875 -> 1 - 0.1875 / 1.25 = 0.85. Constant returns -> reported as 0.
    mask = mask_of([[1, 1, 1, 1]])
    ret = t([[1, 2, 3, 4]])
    assert explained_variance(ret, ret, mask).item() == pytest.approx(1.0)
    assert explained_variance(t([[1, 2, 3, 3]]), ret, mask).item() == pytest.approx(0.85)
    assert explained_variance(ret, torch.ones(1, 4), mask).item() == 0.0
    _, stats = value_loss(ret, t([[1, 2, 3, 3]]), ret, mask, eps_clip=0.5)
    assert stats["critic/explained_variance"].item() == pytest.approx(0.85)


def test_explained_variance_over_processes_is_that_of_the_whole_batch():
    # Process A holds returns [1, 2] (old values [1, 2]), process B [3, 4] (old values [3, 3]): together the
    # batch of test_explained_variance, 0.85. Each alone: A explains everything (1.0); B's returns have
    # variance 0.25 and its residuals [0, 1] too, so 0.0; their plain mean (0.5) is not the batch's.
    mask = mask_of([[1, 1]])
    sent = []
    b = explained_variance(t([[3, 3]]), t([[3, 4]]), mask, all_reduce=lambda s: sent.append(s) or s)
    assert b.item() == pytest.approx(0.0)
    a = explained_variance(t([[1, 2]]), t([[1, 2]]), mask, all_reduce=lambda s: s + sent[0])
    assert a.item() == pytest.approx(0.85)
    assert explained_variance(t([[1, 2]]), t([[1, 2]]), mask).item() == pytest.approx(1.0)
    # Padding of one process does not count; a process with no tokens adds nothing.
    padded = explained_variance(t([[1, 2, 9]]), t([[1, 2, 0]]), mask_of([[1, 1, 0]]), all_reduce=lambda s: s + sent[0])
    assert padded.item() == pytest.approx(0.85)
    empty = explained_variance(t([[5.0]]), t([[7.0]]), mask_of([[0]]), all_reduce=lambda s: s + sent[0])
    assert empty.item() == pytest.approx(0.0)


def test_value_rejects_bad_eps():
    with pytest.raises(ValueError, match="eps_clip"):
        value_loss(t([[0.0]]), t([[0.0]]), t([[0.0]]), mask_of([[1]]), eps_clip=0.0)


def _micro(n_tokens: float, clip: float, ratio_max: float, odd: float) -> dict:
    return {"actor/n_valid_tokens": Stat.sum(torch.tensor(n_tokens)),
            "actor/clip_frac": Stat.mean(torch.tensor(clip), weight=torch.tensor(n_tokens)),
            "actor/importance_ratio/max": Stat.max(torch.tensor(ratio_max)),
            "actor/odd/max": Stat.sum(torch.tensor(odd)),  # the name says max; it was made as a sum
            "actor/lr": Stat.mean(torch.tensor(clip * 10))}


def test_loss_stats_reduce_over_micro_batches_by_how_they_were_made():
    # Micro-batch 0: 30 tokens, clip 0.1; micro-batch 1: 10 tokens, clip 0.5 -> token-weighted 0.2, not the plain 0.3.
    out = reduce_stats([_micro(30.0, 0.1, 1.5, 1.0), _micro(10.0, 0.5, 2.5, 2.0)])
    assert {k: v.item() for k, v in out.items()} == pytest.approx(
        {"actor/n_valid_tokens": 40.0, "actor/clip_frac": 0.2, "actor/importance_ratio/max": 2.5,
         "actor/odd/max": 3.0, "actor/lr": 3.0})
    assert out["actor/clip_frac"].weight.item() == 40.0 and out["actor/lr"].weight is None
    assert [out[k].reduction for k in ("actor/n_valid_tokens", "actor/importance_ratio/max", "actor/odd/max")] == [
        Reduction.SUM, Reduction.MAX, Reduction.SUM]


def test_plain_tensors_get_the_documented_default():
    """A user's plain tensor: the namespace's token count is summed, any other key of a namespace that reports it
    is its token-weighted mean (whatever its name ends in), the rest a plain mean."""
    micro = [{"actor/n_valid_tokens": 30.0, "actor/spo/frac": 0.1, "actor/spo/frac/max": 0.1, "mine/x": 1.0},
             {"actor/n_valid_tokens": 10.0, "actor/spo/frac": 0.5, "actor/spo/frac/max": 0.5, "mine/x": 2.0}]
    out = reduce_stats([{k: torch.tensor(v) for k, v in r.items()} for r in micro])
    assert {k: v.item() for k, v in out.items()} == pytest.approx(
        {"actor/n_valid_tokens": 40.0, "actor/spo/frac": 0.2, "actor/spo/frac/max": 0.2, "mine/x": 1.5})
    made = declared({"actor/n_valid_tokens": torch.tensor(3.0), "actor/y": torch.tensor(0.5),
                     "mine/x": torch.tensor(1.0)})
    assert [(v.reduction, None if v.weight is None else v.weight.item()) for v in made.values()] == [
        (Reduction.SUM, None), (Reduction.MEAN, 3.0), (Reduction.MEAN, None)]


def test_a_statistic_made_two_ways_in_one_step_is_an_error():
    with pytest.raises(ValueError, match="'actor/x' was made with different reductions"):
        reduce_stats([{"actor/x": Stat.max(torch.tensor(1.0))}, {"actor/x": Stat.min(torch.tensor(1.0))}])
