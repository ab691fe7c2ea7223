"""Where a step's trajectory groups come from, chosen once from ``rollout.*``:

* ``max_head_offpolicyness = 0`` (default): :class:`SyncSource`, generate then train, on the policy
  itself (or on a copy in ``rollout.dtype``);
* ``> 0`` with ``offpolicy_mode=concurrent``: :class:`~areal_trainer.train.async_rollout.AsyncSource`,
  a rollout thread on its own copy of the policy, bounded by the staleness manager;
* ``> 0`` with ``offpolicy_mode=lagged``: :class:`~areal_trainer.train.lagged.LaggedSource`,
  seeded lagging snapshots, no concurrency.

Every source offers ``next_batch(version) -> Batch``, ``update_weights(model, version)`` (the
trainer's new weights, after each step), ``state_dict()`` / ``load_state_dict()`` (for checkpoints),
``start()`` and ``close()``; ``load_state_dict(state, version)`` resumes at a policy version. Evaluation never goes through the training rollout: it runs the
workflow on the trainer's own weights (see :func:`build_rollout`), so it neither trains on nor
waits for the buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..config.schema import TrainerConfig
from ..plugins import import_object
from ..rollout.backends import make_engine, share_prefill
from ..rollout.engine import HFEngine
from ..rollout.staleness import StalenessManager
from ..rollout.weights import rollout_copy
from .async_rollout import AsyncSource
from .collect import Batch, collect_groups
from .lagged import LaggedSource

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SyncSource:
    """Generate a batch, then train on it (``collect.py``)."""

    def __init__(self, *, loader, workflow, engine, gconfig, batch_size: int, accept: Callable | None,
                 dynamic_bs: bool, max_rounds: int, world_size: int = 1,
                 reduce_max: Callable[[int], int] = lambda x: x):
        self.loader, self.workflow, self.engine, self.gconfig = loader, workflow, engine, gconfig
        self.kwargs = dict(batch_size=batch_size, accept=accept, dynamic_bs=dynamic_bs, max_rounds=max_rounds,
                           world_size=world_size, reduce_max=reduce_max)

    def start(self) -> None:
        pass

    def next_batch(self, version: int) -> Batch:
        return collect_groups(self.loader, self.workflow, self.gconfig, **self.kwargs)

    def update_weights(self, model, version: int) -> None:
        self.engine.update_weights(model, version)

    def state_dict(self) -> dict:
        return {"loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict, version: int) -> None:
        self.loader.load_state_dict(state["loader"])

    def close(self) -> None:
        pass


@dataclass
class Rollout:
    """The training rollout (``source`` and its ``engine``) and the evaluation workflow."""

    source: Any
    engine: Any
    eval_workflow: Any


def rollout_mode(cfg: TrainerConfig) -> str:
    """``sync``, ``concurrent`` or ``lagged``."""
    if cfg.rollout.max_head_offpolicyness == 0:
        return "sync"
    return cfg.rollout.offpolicy_mode


def build_rollout(cfg: TrainerConfig, *, model, tokenizer, reward, loader, device: torch.device, autocast_dtype,
                  world_size: int, reduce_max: Callable[[int], int]) -> Rollout:
    """Engines, workflows and the source for ``cfg`` (see the module docstring)."""
    r, mode = cfg.rollout, rollout_mode(cfg)
    workflow_cls = import_object(r.workflow, "rollout.workflow")

    def workflow(engine):
        return workflow_cls(engine=engine, tokenizer=tokenizer, reward=reward, **r.workflow_kwargs)

    dtype = DTYPES.get(r.dtype) if r.dtype else None
    if mode == "sync" and dtype is None:  # the policy samples itself (hf), or vLLM holds its own weights
        engine = make_engine(cfg, model, tokenizer, device=device, autocast_dtype=autocast_dtype)
        eval_workflow = train_workflow = workflow(engine)
    else:
        if r.backend == "vllm":
            engine = make_engine(cfg, model, tokenizer, device=device, autocast_dtype=autocast_dtype,
                                 interruptible=mode == "concurrent" and r.partial_rollout)
        else:
            engine = HFEngine(rollout_copy(model, dtype), tokenizer, device=device,
                              autocast_dtype=None if dtype is not None else autocast_dtype,
                              batch_size=r.generation_batch_size, stoppable=True,
                              interruptible=mode == "concurrent" and r.partial_rollout, share_prefill=share_prefill(cfg))
        train_workflow = workflow(engine)
        # Evaluation measures the trained weights themselves, in the trainer's precision.
        eval_workflow = workflow(HFEngine(model, tokenizer, device=device, autocast_dtype=autocast_dtype,
                                          batch_size=r.generation_batch_size, share_prefill=share_prefill(cfg)))
    common = dict(loader=loader, workflow=train_workflow, engine=engine, gconfig=cfg.gconfig,
                  batch_size=cfg.train_dataset.batch_size // world_size,
                  accept=import_object(r.dynamic_filter, "rollout.dynamic_filter") if r.dynamic_filter else None,
                  dynamic_bs=cfg.dynamic_bs, max_rounds=r.max_sampling_rounds)
    if mode == "sync":
        source = SyncSource(**common, world_size=world_size, reduce_max=reduce_max)
    elif mode == "lagged":
        source = LaggedSource(**common, eta=r.max_head_offpolicyness, seed=cfg.seed, switch_prob=r.lagged_switch_prob,
                              world_size=world_size, reduce_max=reduce_max)
    else:
        b = cfg.train_dataset.batch_size
        concurrent = r.max_concurrent_rollouts or b
        queue = r.queue_size or 16 * concurrent
        staleness = StalenessManager(max_head_offpolicyness=r.max_head_offpolicyness,
                                     consumer_bs=max(1, b // world_size),
                                     max_concurrent=max(1, concurrent // world_size), count_rejected=cfg.dynamic_bs)
        source = AsyncSource(**common, staleness=staleness, queue_size=max(1, queue // world_size),
                             request_timeout=r.request_timeout)
    return Rollout(source=source, engine=engine, eval_workflow=eval_workflow)
