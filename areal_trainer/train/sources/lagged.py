"""Reproducible off-policy data (``rollout.max_head_offpolicyness`` = eta > 0,
``rollout.offpolicy_mode=lagged``): staleness without concurrency.

The trainer keeps snapshots of its last ``eta + 1`` policy versions. At step ``v`` each prompt group
is sampled by the snapshot ``v - lag``, with ``lag`` drawn uniformly from ``[0, min(eta, v)]`` by a
generator seeded from ``seed`` and ``v`` (the groups of one lag are generated together). With
``rollout.lagged_switch_prob = p``, each such generation switches with probability ``p`` to a newer
snapshot after a seeded number of tokens, as when a weight update lands mid-generation: the
answers still running carry two versions. Everything is synchronous and seeded, so two runs with one
seed are identical and a resumed run equals an uninterrupted one (the snapshots are checkpointed).
It lets tests and researchers compare off-policy corrections exactly, at a staleness they choose.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...rollout.engines.weights import snapshot
from .collect import Batch, collect_groups

LAG_SEED = 7919
"""Mixed into ``seed`` for the lag generator, so it is independent of the sampling streams."""


class LaggedWorkflow:
    """Wraps the workflow: each ``rollout`` call samples its prompts with lagging snapshots."""

    def __init__(self, source: LaggedSource):
        self.source = source

    def rollout(self, samples: list[dict], gconfig) -> list:
        src = self.source
        v, eta, gen = src.version, src.eta, src.generator
        lags = torch.randint(0, min(eta, v) + 1, (len(samples),), generator=gen).tolist()
        out: list = [None] * len(samples)
        for lag in sorted(set(lags), reverse=True):  # oldest snapshot first
            idx = [i for i, x in enumerate(lags) if x == lag]
            src.engine.update_weights(src.snapshots[v - lag], v - lag)
            if lag > 0 and float(torch.rand((), generator=gen)) < src.switch_prob:
                newer = v - int(torch.randint(0, lag, (), generator=gen))
                after = int(torch.randint(1, max(gconfig.max_new_tokens, 2), (), generator=gen))
                src.engine.schedule_update(after, src.snapshots[newer], newer)
            for i, group in zip(idx, src.workflow.rollout([samples[i] for i in idx], gconfig)):
                out[i] = group
        return out


class LaggedSource:
    """Synchronous collection (``collect.py``) with lagging policy snapshots (see the module docstring).

    ``engine`` is a separate engine (its own copy of the policy) that ``workflow`` samples with."""

    def __init__(self, *, loader, workflow, engine, gconfig, batch_size: int, accept: Callable | None,
                 dynamic_bs: bool, max_rounds: int, eta: int, seed: int, switch_prob: float,
                 world_size: int = 1, reduce_max: Callable[[int], int] = lambda x: x):
        self.loader, self.workflow, self.engine, self.gconfig = loader, workflow, engine, gconfig
        self.batch_size, self.accept, self.dynamic_bs, self.max_rounds = batch_size, accept, dynamic_bs, max_rounds
        self.eta, self.seed, self.switch_prob = eta, seed, switch_prob
        self.world_size, self.reduce_max = world_size, reduce_max
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.version = 0
        self.generator = torch.Generator()

    def next_batch(self, version: int) -> Batch:
        self.version = version
        self.generator.manual_seed((self.seed * 1_000_003 + LAG_SEED) * 65_537 + version)
        return collect_groups(self.loader, LaggedWorkflow(self), self.gconfig, batch_size=self.batch_size,
                              accept=self.accept, dynamic_bs=self.dynamic_bs, max_rounds=self.max_rounds,
                              world_size=self.world_size, reduce_max=self.reduce_max)

    def update_weights(self, model, version: int) -> None:
        """Keep a snapshot of the new weights (policy ``version``) and forget those beyond ``eta`` versions."""
        self.snapshots[int(version)] = snapshot(model)
        for old in [u for u in self.snapshots if u < version - self.eta]:
            del self.snapshots[old]

    def state_dict(self) -> dict:
        return {"loader": self.loader.state_dict(), "snapshots": self.snapshots}

    def load_state_dict(self, state: dict, version: int) -> None:
        self.loader.load_state_dict(state["loader"])
        self.snapshots = {int(k): v for k, v in state["snapshots"].items()}

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass
