"""Where a step's trajectory groups come from, chosen once from ``rollout.*``:

* ``max_head_offpolicyness = 0`` (default): :class:`SyncSource`, generate then train, on the policy
  itself (or on a copy in ``rollout.dtype``);
* ``> 0`` with ``offpolicy_mode=concurrent``: :class:`~areal_trainer.train.sources.concurrent.AsyncSource`,
  a rollout thread on its own copy of the policy, bounded by the staleness manager;
* ``> 0`` with ``offpolicy_mode=lagged``: :class:`~areal_trainer.train.sources.lagged.LaggedSource`,
  seeded lagging snapshots, no concurrency.

Every source is a :class:`RolloutSource`: ``next_batch(version) -> Batch``, ``update_weights(model, version)`` (the
trainer's new weights, after each step), ``state_dict()`` / ``load_state_dict()`` (for checkpoints),
``start()`` and ``close()``; ``load_state_dict(state, version)`` resumes at a policy version. Evaluation
never goes through the training rollout: it runs the workflow on the trainer's own weights (see
:func:`build_rollout`), so it neither trains on nor waits for the buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from ...components.rollout import RolloutParts
from ...config.schema import TrainerConfig
from ...dtypes import torch_dtype
from ...model.vision import VisionEncoder
from ...rollout.engines.backends import ENGINES, EngineSpec
from ...rollout.staleness import StalenessManager
from .collect import Batch, collect_groups
from .concurrent import AsyncSource
from .lagged import LaggedSource


@runtime_checkable
class RolloutSource(Protocol):
    """What the trainer asks of a rollout source (:class:`SyncSource`, ``AsyncSource``, ``LaggedSource``)."""

    def start(self) -> None:
        """Begin producing (a concurrent source starts its thread); called once, before the first batch."""

    def next_batch(self, version: int) -> Batch:
        """The groups to train the step that produces policy ``version + 1`` on."""

    def update_weights(self, model, version: int) -> None:
        """The trainer's new weights, at policy ``version``, after each step."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the source (the loader's position, buffered groups)."""

    def load_state_dict(self, state: dict, version: int) -> None:
        """Resume from :meth:`state_dict` at policy ``version``."""

    def close(self) -> None:
        """Stop producing and release what the source holds; safe to call twice."""


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
    """The training rollout (``source`` and its ``engine``), the evaluation workflow, and whether the
    rollout samples from the trainer's own model object (``colocated``)."""

    source: RolloutSource
    engine: Any
    eval_workflow: Any
    colocated: bool


def vision_for(cfg: TrainerConfig, spec: EngineSpec, processor, tokenizer) -> dict:
    """An agent workflow's ``vision`` (the processor it renders image requests with) and ``no_images`` (why a
    request with images is refused, when it is)."""
    if processor is None:
        return {"vision": None, "no_images": f"the policy (actor.path={cfg.actor.path!r}) is a text-only model"}
    if not spec.takes_images:
        return {"vision": None, "no_images": f"rollout.backend={cfg.rollout.backend!r} samples text prompts only "
                                             "(rollout.backend=hf samples with images)"}
    return {"vision": VisionEncoder(processor, tokenizer), "no_images": ""}


def rollout_mode(cfg: TrainerConfig) -> str:
    """``sync``, ``concurrent`` or ``lagged``."""
    if cfg.rollout.max_head_offpolicyness == 0:
        return "sync"
    return cfg.rollout.offpolicy_mode


def build_rollout(cfg: TrainerConfig, parts: RolloutParts, *, model, tokenizer, reward, loader, device: torch.device,
                  autocast_dtype, world_size: int, reduce_max: Callable[[int], int], eval_reward=None,
                  work_dir: str = ".", dist=None, processor=None) -> Rollout:
    """Engines, workflows and the source for ``cfg`` (see the module docstring). ``parts``: the engine's
    registry entry, the workflow class and the filter, bound at start-up (``components/rollout.py``).
    ``eval_reward``: the evaluation's reward service when it differs from the training rollouts' ``reward``
    (pure distillation trains without one). ``processor``: an image-text-to-text policy's, for workflows whose
    requests may carry images (agents: ``takes_vision``)."""
    r, mode = cfg.rollout, rollout_mode(cfg)
    eval_reward = reward if eval_reward is None else eval_reward

    def workflow(engine, scorer=reward, spec: EngineSpec = parts.engine):
        kwargs = dict(parts.workflow_kwargs)
        if getattr(parts.workflow, "takes_vision", False):
            kwargs.update(vision_for(cfg, spec, processor, tokenizer))
        return parts.workflow(engine=engine, tokenizer=tokenizer, reward=scorer, **kwargs)

    def engine(spec: EngineSpec, **kw):
        if spec.servers:  # they write under the run directory; the main process starts them
            kw.update(work_dir=work_dir, dist=dist)
        return spec.make(model, tokenizer, device=device, autocast_dtype=autocast_dtype, seed=cfg.seed,
                         dtype=torch_dtype(r.dtype), batch_size=r.generation_batch_size,
                         share_prefill=share_prefill(cfg), **parts.engine_kwargs, **kw)

    # Synchronous in the trainer's precision: the policy samples itself (or an engine holds its own weights).
    # Otherwise the engine gets its own copy and stops at every token for weight updates and switches.
    colocated = mode == "sync" and r.dtype is None and not parts.engine.servers
    rollout_engine = engine(parts.engine, stoppable=not colocated,
                            interruptible=mode == "concurrent" and r.partial_rollout)
    train_workflow = workflow(rollout_engine)
    if colocated:
        eval_workflow = train_workflow if eval_reward is reward else workflow(rollout_engine, eval_reward)
    else:  # evaluation measures the trained weights themselves, in the trainer's precision
        eval_workflow = workflow(ENGINES["hf"].make(model, tokenizer, device=device, autocast_dtype=autocast_dtype,
                                                     seed=cfg.seed, dtype=None, batch_size=r.generation_batch_size,
                                                     share_prefill=share_prefill(cfg), stoppable=False,
                                                     interruptible=False), eval_reward, ENGINES["hf"])
    common = dict(loader=loader, workflow=train_workflow, engine=rollout_engine, gconfig=cfg.gconfig,
                  batch_size=cfg.train_dataset.batch_size // world_size, accept=parts.accept,
                  dynamic_bs=cfg.dynamic_bs, max_rounds=r.max_sampling_rounds)
    if mode == "sync":
        source = SyncSource(**common, world_size=world_size, reduce_max=reduce_max)
    elif mode == "lagged":
        source = LaggedSource(**common, eta=r.max_head_offpolicyness, seed=cfg.seed, switch_prob=r.lagged_switch_prob,
                              world_size=world_size, reduce_max=reduce_max)
    else:
        b = cfg.train_dataset.batch_size
        # An agent call lasts as long as its slowest episode (tools wait on the wall clock), so by default one
        # call takes every group the staleness bound admits rather than one step's: tool time is paid once
        # for several steps. The staleness manager still bounds every token's lag.
        concurrent = r.max_concurrent_rollouts or (b * (r.max_head_offpolicyness + 1) if r.agent is not None else b)
        queue = r.queue_size or 16 * concurrent
        staleness = StalenessManager(max_head_offpolicyness=r.max_head_offpolicyness,
                                     consumer_bs=max(1, b // world_size),
                                     max_concurrent=max(1, concurrent // world_size), count_rejected=cfg.dynamic_bs)
        source = AsyncSource(**common, staleness=staleness, queue_size=max(1, queue // world_size),
                             request_timeout=r.request_timeout)
    return Rollout(source=source, engine=rollout_engine, eval_workflow=eval_workflow, colocated=colocated)


def share_prefill(cfg: TrainerConfig) -> bool:
    """HF generation prefills a prompt once for all its samples unless shared-prefix computation is
    switched off (``actor.enable_tree_training=false``: every row computed in full, everywhere)."""
    return cfg.actor.enable_tree_training is not False
