"""Which source and engines a configuration gets: synchronous runs sample from the policy itself;
asynchronous, lagged and lower-precision runs sample from their own copy; evaluation always runs on
the trainer's own weights, never through the training buffer."""

import inspect

import pytest
import torch

from areal_trainer.components import load
from areal_trainer.data.loader import PromptLoader
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.train.sources.build import RolloutSource, SyncSource, build_rollout, rollout_mode
from areal_trainer.train.sources.concurrent import AsyncSource
from areal_trainer.train.sources.lagged import LaggedSource
from tests.groups import reward_service


@pytest.mark.parametrize("overrides,kind,copy", [
    ([], SyncSource, False),
    (["rollout.dtype=bfloat16"], SyncSource, True),
    (["rollout.max_head_offpolicyness=2"], AsyncSource, True),
    (["rollout.max_head_offpolicyness=2", "rollout.offpolicy_mode=lagged"], LaggedSource, True),
])
def test_sources_engines_and_evaluation(overrides, kind, copy):
    built = load("grpo", ["+scale=tiny", *overrides])
    cfg = built.config
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    mode = rollout_mode(cfg)
    loader = PromptLoader(list(range(8)), 2, shuffle=False, drop_last=True, seed=0,
                          mode="local" if mode == "concurrent" else "global")
    reward = reward_service(max_error_fraction=1.0)
    r = build_rollout(cfg, built.rollout, model=model, tokenizer=tok, reward=reward, loader=loader,
                      device=torch.device("cpu"), autocast_dtype=None, world_size=1, reduce_max=lambda x: x)
    assert isinstance(r.source, kind) and isinstance(r.source, RolloutSource)
    assert (r.engine.model is not model) == copy
    assert r.eval_workflow.engine.model is model  # evaluation measures the trained weights themselves
    if "rollout.dtype=bfloat16" in overrides:
        assert next(r.engine.model.parameters()).dtype == torch.bfloat16
    if kind is AsyncSource:
        assert r.engine.gate.interruptible and r.source.staleness.eta == 2
        assert r.source.staleness.consumer_bs == cfg.train_dataset.batch_size


@pytest.mark.parametrize("cls", [SyncSource, AsyncSource, LaggedSource], ids=lambda c: c.__name__)
def test_every_source_offers_what_the_trainer_asks(cls):
    """``RolloutSource`` is the one statement of the sources' seam: each source has every method, callable
    with the protocol's arguments."""
    for name in ("start", "next_batch", "update_weights", "state_dict", "load_state_dict", "close"):
        wanted = inspect.signature(getattr(RolloutSource, name))
        have = inspect.signature(getattr(cls, name))
        args = [None] * (len(wanted.parameters))
        have.bind(*args)  # raises TypeError when the source cannot take the protocol's call
