"""The reproducible off-policy mode: groups sampled by snapshots lagging a seeded number of versions
in [0, eta], generations switching to a newer snapshot inside answers, identical batches for one
seed, and only the last eta + 1 snapshots kept."""

import pytest
import torch

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.data import arith
from areal_trainer.data.loader import PromptLoader
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.engines.hf import HFEngine, rollout_copy
from areal_trainer.rollout.workflows.single_turn import RLVRWorkflow
from areal_trainer.train.sources.lagged import LaggedSource
from tests.groups import reward_service

G = GenerationHyperparameters(n_samples=2, max_new_tokens=10, temperature=1.0)


@pytest.fixture(scope="module")
def parts():
    tok = build_tokenizer()
    models = [build_model("builtin:tiny", tok, seed=s).eval() for s in range(4)]
    samples = [{"messages": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
               for r in arith.generate("train", 64)]
    return tok, models, samples


def _source(parts, eta=2, switch=1.0, seed=3):
    tok, models, samples = parts
    engine = HFEngine(rollout_copy(models[0]), tok, device=torch.device("cpu"), stoppable=True)
    reward = reward_service(max_error_fraction=1.0)
    loader = PromptLoader(samples, 8, shuffle=False, drop_last=True, seed=0)
    src = LaggedSource(loader=loader, workflow=RLVRWorkflow(engine=engine, tokenizer=tok, reward=reward),
                       engine=engine, gconfig=G, batch_size=8, accept=None, dynamic_bs=False, max_rounds=1, eta=eta,
                       seed=seed, switch_prob=switch)
    for v, m in enumerate(models):
        src.update_weights(m, v)
    return src


def test_groups_lag_within_eta_and_answers_switch_to_newer_snapshots(parts):
    src = _source(parts)
    assert sorted(src.snapshots) == [1, 2, 3]  # the last eta + 1 versions
    torch.manual_seed(0)
    batch = src.next_batch(3)
    assert len(batch.groups) == 8
    spans, oldest = 0, []
    for g in batch.groups:
        v = g["versions"]
        assert int(v.max()) <= 3 and g.min_version >= 1
        oldest.append(g.min_version)
        for row in v:
            seen = row[row >= 0].tolist()
            assert seen == sorted(seen)
            spans += len(set(seen)) == 2
    assert len(set(oldest)) > 1, "different groups drew different lags"
    assert spans > 0, "with switch probability 1 some answers outlived the switch"


def test_one_seed_one_batch(parts):
    a, b = _source(parts), _source(parts)
    torch.manual_seed(0)
    x = a.next_batch(3)
    torch.manual_seed(0)
    y = b.next_batch(3)
    for g, h in zip(x.groups, y.groups):
        for k in g.keys():
            assert torch.equal(g[k], h[k]), k
    torch.manual_seed(0)
    z = _source(parts, seed=4).next_batch(3)
    assert any(not torch.equal(g["versions"], h["versions"]) for g, h in zip(x.groups, z.groups))


def test_at_version_zero_everything_is_on_policy(parts):
    src = _source(parts)
    src.snapshots = {0: src.snapshots[1]}
    batch = src.next_batch(0)
    assert all(g.min_version == 0 and int(g["versions"].max()) == 0 for g in batch.groups)


def test_state_round_trip_keeps_the_snapshots(parts):
    src = _source(parts)
    state = src.state_dict()
    other = _source(parts, seed=3)
    other.snapshots = {}
    other.load_state_dict(state, version=3)
    assert sorted(other.snapshots) == [1, 2, 3]
    for v in other.snapshots:
        for k, t in other.snapshots[v].items():
            assert torch.equal(t, src.snapshots[v][k])
