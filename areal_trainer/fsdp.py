"""Sharded data parallelism with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Chosen by the key ``parallel.fsdp=true`` (saved with the run's config), with the processes started by
``scheduler.type=local``, ``torchrun`` or ``accelerate launch`` (``--use_fsdp --fsdp_version 2`` then
agrees with the key; a launcher that asks for FSDP2 without it is an error). The data-parallel scheme
of ``dist.py`` is unchanged (each rank its own rows, losses divided by the *global* normaliser); only
the weights, gradients and optimizer state are split over the ranks:

* every decoder layer and then the whole model become FSDP2 units; each unit all-gathers its weights
  before its forward and reduce-scatters its gradients after its backward. The reduction is a plain
  SUM (divide factor 1), because the losses already carry the global normaliser: the summed
  gradient is the single-process gradient, as with ``DistContext.sync_gradients``.
* the root unit (embeddings, final norm, tied head) keeps its weights gathered from its forward
  until its backward. ``train/models/logprobs.py`` runs ``model.base_model`` and then reads the head
  weight itself, so the backbone's forward is routed through the root's FSDP hooks
  (:func:`_route_backbone_through_root`).
* training forwards and backwards are collectives, so every rank must run the same number of them
  (``train/models/update.py`` pads with zero-weight micro-batches). Generation and the other no-grad
  forwards run inside :func:`gathered`, which unshards the whole model once and keeps it so: they
  then need no communication, and ranks may generate different numbers of tokens or batches.
* checkpoints use the full (unsharded) state dict, so they stay plain Hugging Face weights that load
  with or without FSDP. Weights pushed to inference servers go as a :class:`WeightStream`, gathered
  one tensor at a time, so no rank ever holds a second full copy of the model.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from .errors import UserError


def check_launcher(fsdp: bool) -> None:
    """``accelerate launch --use_fsdp`` must agree with ``parallel.fsdp`` (and ask for FSDP version 2)."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() not in ("1", "true"):
        return
    if not fsdp:
        raise UserError("accelerate launch --use_fsdp asks for FSDP2, but parallel.fsdp=false: add parallel.fsdp=true "
                        "(the key decides; it is saved with the run's config).")
    if os.environ.get("FSDP_VERSION", "1") != "2":
        raise UserError("accelerate launch --use_fsdp defaults to FSDP version 1, which this trainer does not "
                        "implement; add --fsdp_version 2.")


def is_sharded(model) -> bool:
    return isinstance(model, FSDPModule)


def device_mesh(device: torch.device, world_size: int):
    return init_device_mesh(device.type, (world_size,))


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: the classes Hugging Face names in ``_no_split_modules`` (none: the
    root is the only unit, still sharded, but gathered whole for every forward)."""
    names = {n for m in model.modules() for n in (getattr(m, "_no_split_modules", None) or [])}
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """Shard ``model`` in place (each transformer block, then the root); returns it.

    ``fully_shard`` replaces the parameters by sharded ``DTensor`` ones: build the optimizer after
    this, and copy the model (reference policy, critic) before it.
    """
    for layer in _layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum over ranks: the losses carry the global normaliser
            m.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no AVG/PREMUL_SUM)
    if hasattr(model, "get_output_embeddings") and getattr(model, "base_model", model) is not model:
        _route_backbone_through_root(model)
    return model


def _route_backbone_through_root(model: torch.nn.Module) -> None:
    """Make ``model.base_model(...)`` called on its own behave like a forward of the root unit.

    The policy's log-probabilities come from the backbone plus the head weight, read directly
    (``train/models/logprobs.py``); the root's pre-forward hook must gather the embeddings and head first,
    and its post-forward hook must register the backward that reduce-scatters their gradients. A
    backbone call from inside the root's own forward (``generate``) passes straight through. An
    image-text-to-text model's ``get_image_features``, which ``generate`` calls before the root's first
    forward, is routed the same way.
    """
    backbone = model.base_model
    depth = [0]  # > 0 while the root's own forward runs
    model.register_forward_pre_hook(lambda *_: depth.__setitem__(0, depth[0] + 1))
    model.register_forward_hook(lambda *_: depth.__setitem__(0, depth[0] - 1), always_call=True)
    for name in ("forward", "get_image_features"):
        plain = getattr(backbone, name, None)
        if plain is None:
            continue
        routed = f"fsdp_backbone_{name}"
        setattr(model, routed, plain)
        register_fsdp_forward_method(model, routed)

        setattr(backbone, name, _routed_method(model, plain, routed, depth))


def _routed_method(model: torch.nn.Module, plain, routed: str, depth: list[int]):
    """``plain`` when called inside the root's forward, else the root's FSDP-hooked ``routed`` method; with
    ``plain``'s signature (``generate`` reads it to pick the arguments of ``get_image_features``)."""
    @functools.wraps(plain)
    def method(*args, **kwargs):
        if depth[0]:  # inside the root's forward, or another routed call: its hooks have run
            return plain(*args, **kwargs)
        depth[0] += 1
        try:
            return getattr(model, routed)(*args, **kwargs)
        finally:
            depth[0] -= 1

    return method


@contextlib.contextmanager
def gathered(model):
    """Keep the whole sharded ``model`` unsharded (one all-gather per unit on entry, reshard on exit).

    Forwards inside need no communication, so ranks may run different numbers of them (generation
    stops when a rank's own sequences end). For no-grad use only. A no-op for an unsharded model.
    """
    if not is_sharded(model):
        yield model
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield model
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(m is not model, recurse=False)  # as shard_model set them


def full_state_dict(model, *, all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """The full weights of ``model`` (collective: call on every rank).

    On rank 0 only, on the CPU (for checkpoints), or with ``all_ranks`` on every rank, on the
    model's device (to push weights to a rollout engine).
    """
    if not is_sharded(model):
        return model.state_dict()
    opts = StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks)
    return get_model_state_dict(model, options=opts)


class WeightStream:
    """The full weights of a sharded model as ``(name, tensor)`` pairs, each tensor all-gathered when it is
    reached: a consumer that sends them on in buckets (disk files, a broadcast to the servers) holds one bucket,
    never the whole model. ``metas()`` gives names, full shapes and dtypes without gathering anything.

    Every pass is collective: every process must walk each one, in the same order. The main process, which
    sends the weights, *leads*: each pass it starts is announced to the others, which :meth:`follow` until it
    calls :meth:`finish`. A pass the leader leaves midway (a server gone during an update) is walked to its end
    by the leader before its next one starts, so a retry is a fresh pass that every process takes in step.
    A model that is not sharded gives its own tensors and needs no other process."""

    def __init__(self, model: torch.nn.Module, *, lead: bool = False):
        self.state = model.state_dict()  # sharded DTensors; tied weights appear under both names
        self.device = next(model.parameters()).device
        self.lead = lead
        self._open = None

    def metas(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` pairs whose shape and dtype are the full tensor's (not gathered)."""
        return list(self.state.items())

    def __iter__(self):
        self._close()
        if self.lead:
            self._announce(True)
        self._open = self._walk()
        return self._open

    def finish(self) -> None:
        """The leader's last word: the others stop following."""
        self._close()
        if self.lead:
            self._announce(False)

    def follow(self) -> int:
        """Walk every pass the leader announces, until it finishes; returns how many there were."""
        passes = 0
        while self._announce(None):
            for _ in self._walk():
                pass
            passes += 1
        return passes

    def _walk(self):
        for name, t in self.state.items():
            yield name, (t.full_tensor() if isinstance(t, DTensor) else t).detach()

    def _close(self) -> None:
        if self._open is not None:
            for _ in self._open:  # the rest of a pass left midway: the others are still in it
                pass
            self._open = None

    def _announce(self, go: bool | None) -> bool:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return bool(go)
        flag = torch.tensor([int(bool(go))], dtype=torch.int64, device=self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())


def optimizer_state(model, optimizer) -> dict:
    """The optimizer state to checkpoint; for a sharded model the full state on rank 0 (collective)."""
    if not is_sharded(model):
        return optimizer.state_dict()
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model, optimizer, state: dict) -> None:
    """Inverse of :func:`optimizer_state` (every rank passes the full state it read from the checkpoint)."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that also works on sharded (``DTensor``) gradients.

    The norm of sharded gradients is a partial ``DTensor``; ``full_tensor()`` all-reduces it, so
    every rank clips with (and reports) the same global norm.
    """
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def max_over_ranks(n: int) -> int:
    """The largest ``n`` of all ranks (collective)."""
    t = torch.tensor(n, dtype=torch.int64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)
