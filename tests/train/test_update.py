"""The optimizer update: the gradient does not depend on the micro-batch split, and a non-finite
loss skips the step without touching the weights."""

import copy

import pytest
import torch

from areal_trainer.components import load_config
from areal_trainer.components.loss import bind_policy_loss
from areal_trainer.config.parts import MicroBatchSpec
from areal_trainer.dist import DistContext
from areal_trainer.loss import PolicyLogprobs, Stat, reduce_stats
from areal_trainer.metrics import Max, Mean, Sum, floats, reduce
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.train.batch import UpdateBatch
from areal_trainer.train.models.policy import PolicyModel
from areal_trainer.train.models.update import balanced_partition, micro_batches, typed_stats


def _batch(tok, rows=6, width=10, nan_at=None) -> UpdateBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, len(tok), (rows, width), generator=g)
    am = torch.ones_like(ids)
    for r in range(rows):
        am[r, 4 + r % 5:] = 0
    lm = torch.zeros(rows, width)
    lm[:, 2:] = 1
    lm = lm * torch.roll(am, -1, 1)
    lm[:, -1] = 0
    old = -torch.rand(rows, width, generator=g) * lm
    adv = torch.randn(rows, width, generator=g) * lm
    if nan_at is not None:
        adv[nan_at] = float("nan")
    policies = PolicyLogprobs(old, old, torch.zeros(rows, width, dtype=torch.int32), 0)
    return UpdateBatch(ids, am, lm, adv, policies)


def _policy(cfg, model, tok, opt) -> PolicyModel:
    policy = PolicyModel(model, cfg, tokenizer=tok, device=torch.device("cpu"), dist=DistContext(), adapter_dir=None,
                         base_changed=False)
    policy.optimizer = opt
    return policy


def _grads(n_mbs, mode="token-mean"):
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    cfg = load_config("grpo", ["actor.use_decoupled_loss=false", "actor.recompute_logprob=false",
                               "actor.rejection_sampling=null", f"actor.loss_agg_mode={mode}",
                               f"actor.mb_spec.n_mbs={n_mbs}", "actor.optimizer.type=sgd", "actor.optimizer.lr=1.0",
                               "actor.optimizer.weight_decay=0", "actor.optimizer.gradient_clipping=0"]).actor
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    result = _policy(cfg, model, tok, opt).update(_batch(tok), None, loss_fn=bind_policy_loss(cfg), version=0,
                                                  n_minibatches=cfg.ppo_n_minibatches)
    return {k: before[k] - v for k, v in model.state_dict().items()}, result.metrics, result.n_skipped


def test_micro_batch_split_does_not_change_the_update():
    for mode in ("token-mean", "seq-mean-token-mean"):
        one, m1, _ = _grads(1, mode)
        four, m4, _ = _grads(4, mode)
        for k in one:
            torch.testing.assert_close(one[k], four[k], atol=2e-6, rtol=1e-4)
        assert abs(m1["actor/n_valid_tokens"].value - m4["actor/n_valid_tokens"].value) < 1e-9


def test_partitions_cover_all_rows():
    parts = balanced_partition([5, 1, 9, 3, 3, 7], 3)
    assert sorted(sum(parts, [])) == list(range(6)) and len(parts) == 3
    mbs = micro_batches([0, 1, 2, 3], [10, 10, 10, 10], MicroBatchSpec(max_tokens_per_mb=20))
    assert len(mbs) == 2 and sorted(sum(mbs, [])) == [0, 1, 2, 3]


def test_nonfinite_loss_skips_step():
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    cfg = load_config("grpo", ["actor.use_decoupled_loss=false", "actor.rejection_sampling=null"]).actor
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    result = _policy(cfg, model, tok, opt).update(_batch(tok, nan_at=(0, 2)), None, loss_fn=bind_policy_loss(cfg),
                                                  version=0, n_minibatches=1)  # NaN at a trained position
    assert (result.n_steps, result.n_skipped, result.all_skipped) == (1, 1, True)
    assert result.metrics["update/skipped_steps"].value == 1
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_an_update_with_fewer_rows_than_minibatches_counts_every_step_it_ran():
    """4 minibatches asked for, 2 rows: 2 optimizer steps run, both skipped, so the update skipped all of
    them (the loop's count of consecutive skipped updates must advance, not reset)."""
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    cfg = load_config("grpo", ["actor.use_decoupled_loss=false", "actor.rejection_sampling=null",
                               "actor.ppo_n_minibatches=4"]).actor
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = _batch(tok, rows=2)
    nan = UpdateBatch(batch.input_ids, batch.attention_mask, batch.loss_mask,
                      batch.advantages.masked_fill(batch.loss_mask.bool(), float("nan")), batch.policies)
    result = _policy(cfg, model, tok, opt).update(nan, None, loss_fn=bind_policy_loss(cfg), version=0,
                                                  n_minibatches=cfg.ppo_n_minibatches)
    assert (result.n_steps, result.n_skipped, result.all_skipped) == (2, 2, True)


def test_micro_batch_granularity_and_divisor():
    # Runs of 2 rows stay together; 4 runs over 3 micro-batches, rounded up to a multiple of 2 -> 4.
    spec = MicroBatchSpec(n_mbs=3, granularity=2, n_mbs_divisor=2)
    parts = micro_batches(list(range(8)), [5, 1, 9, 3, 3, 7, 2, 2], spec)
    assert len(parts) == 4 and sorted(sum(parts, [])) == list(range(8))
    for p in parts:
        assert p == [p[0], p[0] + 1] and p[0] % 2 == 0
    assert micro_batches([0, 1, 2], [1, 1, 1], MicroBatchSpec()) == [[0, 1, 2]]  # defaults: one micro-batch


def test_the_loss_statistics_become_metrics_with_the_reduction_they_were_made_with():
    """Two processes, each with its micro-batches reduced (``loss/stats.py``), combine as metrics exactly as all
    micro-batches would have combined at once: the token-weighted mean keeps its tokens as its weight."""
    def micro(tokens: float, frac: float, top: float) -> dict:
        n = torch.tensor(tokens)
        return {"actor/n_valid_tokens": Stat.sum(n), "actor/frac": Stat.mean(torch.tensor(frac), weight=n),
                "actor/top": Stat.max(torch.tensor(top)), "actor/setting": Stat.mean(torch.tensor(frac * 10))}

    a = [micro(30.0, 0.1, 1.0), micro(10.0, 0.3, 4.0)]  # process 0: 40 tokens, frac (3 + 3) / 40 = 0.15
    b = [micro(20.0, 0.6, 2.0)]  # process 1: 20 tokens, frac 0.6
    per_process = [typed_stats(reduce_stats(p)) for p in (a, b)]
    assert per_process[0]["actor/frac"] == Mean(pytest.approx(0.15), weight=40.0)
    assert isinstance(per_process[0]["actor/top"], Max) and isinstance(per_process[0]["actor/n_valid_tokens"], Sum)
    step = floats(reduce(per_process))
    # frac: (0.15 * 40 + 0.6 * 20) / 60 = 0.3; setting: a plain mean in each process ((1 + 3) / 2 = 2, and 6), then
    # of the processes, (2 + 6) / 2 = 4
    assert step == pytest.approx({"actor/n_valid_tokens": 60.0, "actor/frac": 0.3, "actor/top": 4.0,
                                  "actor/setting": 4.0})
