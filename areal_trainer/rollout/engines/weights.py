"""Weights for the rollout: copies of the policy, snapshots, and the gate that lets the trainer's
thread update an engine's weights while a rollout thread is generating with them.

The gate's protocol (one generating thread, one updating thread):

* the generator runs in *segments* (``with gate.generating() as version``); tokens sampled in a
  segment carry ``version``; between two segments it may be paused;
* ``gate.update(load, version)`` marks an update pending, waits for the running segment to end,
  runs ``load()``, records ``version`` and lets the generator continue. An interruptible engine ends
  its segment at the next token once ``gate.pending()`` is true (and continues the unfinished
  answers in a new segment, under the new weights); a non-interruptible one makes the whole
  ``generate`` call one segment, so the update waits for it;
* ``gate.abort()`` makes every segment end and every later one raise :class:`GenerationAborted`.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable

import torch


class GenerationAborted(RuntimeError):
    """The engine was stopped (the run is ending) while or before generating."""


class WeightGate:
    def __init__(self, version: int = 0, interruptible: bool = False):
        self.version = int(version)
        self.interruptible = interruptible
        self.aborted = False
        self._cv = threading.Condition()
        self._updating = False
        self._busy = 0

    def pending(self) -> bool:
        """Whether a running interruptible segment should end now (an update waits, or an abort)."""
        return self.aborted or (self.interruptible and self._updating)

    @contextlib.contextmanager
    def generating(self):
        """One segment of generation; yields the weights' version."""
        with self._cv:
            self._cv.wait_for(lambda: not self._updating or self.aborted)
            if self.aborted:
                raise GenerationAborted("the rollout engine was stopped")
            self._busy += 1
        try:
            yield self.version
        finally:
            with self._cv:
                self._busy -= 1
                self._cv.notify_all()
        if self.aborted:
            raise GenerationAborted("the rollout engine was stopped")

    def update(self, load: Callable[[], None], version: int) -> None:
        """Run ``load()`` between two segments, then sample as version ``version``."""
        with self._cv:
            self._updating = True
            self._cv.wait_for(lambda: self._busy == 0)
        try:
            load()
            self.version = int(version)
        finally:
            with self._cv:
                self._updating = False
                self._cv.notify_all()

    def abort(self) -> None:
        with self._cv:
            self.aborted = True
            self._cv.notify_all()


@torch.no_grad()
def copy_weights(dst: torch.nn.Module, src) -> None:
    """Copy ``src``'s parameters and buffers into ``dst`` (same architecture; dtypes may differ).
    ``src`` is a module, a state dict (name -> tensor), or an iterable of ``(name, tensor)`` pairs that arrive one
    at a time (a weight stream: every parameter of ``dst`` must come, a buffer may)."""
    if isinstance(src, torch.nn.Module | dict):
        tensors = _tensors(src)
        for name, p in dst.named_parameters():
            p.copy_(tensors[name])
        for name, b in dst.named_buffers():
            if name in tensors:
                b.copy_(tensors[name])
        return
    params, buffers = dict(dst.named_parameters()), dict(dst.named_buffers())
    tied = _tied_aliases(dst)
    missing = set(params)
    for name, tensor in src:
        target = params.get(name, buffers.get(name))
        if target is None:
            if name in tied:
                continue  # the output layer tied to the embeddings: it came under its own name too
            raise KeyError(f"weight {name!r} is not a parameter or buffer of the model")
        target.copy_(tensor)
        missing.discard(name)
    if missing:
        raise KeyError(f"the weight stream ended without {len(missing)} parameter(s), e.g. {sorted(missing)[:3]}")


def _tied_aliases(model: torch.nn.Module) -> set[str]:
    """Parameter names that ``named_parameters`` hides because they share a tensor (tied embeddings)."""
    seen = {id(p) for p in model.parameters()}
    return {name for name, p in model.named_parameters(remove_duplicate=False) if id(p) in seen} - \
        {name for name, _ in model.named_parameters()}


def _tensors(model) -> dict[str, torch.Tensor]:
    if isinstance(model, torch.nn.Module):
        return {**dict(model.named_buffers()), **dict(model.named_parameters())}
    return model


def checkpoint_weights(model) -> dict[str, torch.Tensor]:
    """The policy's weights by checkpoint name, with ``lm_head.weight`` present even when it is
    tied to the input embeddings (vLLM keeps a separately packed copy of the output layer that
    is rebuilt only when ``lm_head.weight`` itself is loaded). ``model``: a module, a full state dict, or a stream of
    ``(name, tensor)`` pairs (returned as it is: its sender includes ``lm_head.weight``)."""
    if not isinstance(model, torch.nn.Module | dict):
        return model
    if not isinstance(model, torch.nn.Module):
        weights = {k: v.detach() for k, v in model.items()}
        if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        return weights
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    head = model.get_output_embeddings()
    if head is not None and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = head.weight.detach()
    return weights


def snapshot(model) -> dict[str, torch.Tensor]:
    """A module's (or state dict's, or weight stream's) tensors, copied to the CPU: a policy snapshot for later
    generation."""
    pairs = _tensors(model).items() if isinstance(model, torch.nn.Module | dict) else model
    return {k: v.detach().to("cpu", copy=True) for k, v in pairs}


def rollout_copy(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A frozen copy of the policy for generation (in ``dtype`` when given), on the policy's device."""
    twin = copy.deepcopy(model)
    if dtype is not None:
        twin.to(dtype)
    twin.eval()
    twin.requires_grad_(False)
    return twin
