"""Data-parallel training across processes (``accelerate launch`` or ``torchrun``).

Every rank holds a full copy of the policy, generates for its own slice of each batch of prompts
(whole prompt groups stay on one rank), and computes its local losses divided by the *global*
normaliser. Summing the ranks' gradients (one fused all-reduce per optimizer step) then gives
exactly the gradient of the single-process run on the global batch, and every rank takes the same
optimizer step. Batch-level statistics (reward and advantage normalisation, loss normalisers,
metrics) are all-reduced.

On CPU the process group uses gloo. ``accelerate launch --cpu`` starts only one process; use
``accelerate launch --multi_gpu --num_processes N`` (with no GPU, the processes run on the CPU)
or ``torchrun --nproc_per_node N``.

With ``parallel.fsdp=true`` the same scheme runs with the weights sharded by FSDP2 instead of
replicated (``fsdp.py``; ``DistContext.fsdp``): the gradient sum is then FSDP's reduce-scatter, and
``sync_gradients`` is not used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import fsdp as fsdp_mod
from .metrics import Metric, reduce

_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted",
              "Socket Timeout", "connection was closed")


def peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another rank of the job went away. That rank's
    own failure is the cause (the launcher names it); this one is only its echo."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and isinstance(exc, RuntimeError) and \
        any(s.lower() in str(exc).lower() for s in _PEER_LOST)


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    fsdp: bool = False
    """Weights sharded with FSDP2 over all ranks (see ``fsdp.py``)."""

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place all-reduce (sum/min/max) of a tensor; the identity in a single process."""
        if self.enabled:
            dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
        return t

    def sum_fn(self):
        """``t -> all-reduced sum`` for the math modules (None in a single process)."""
        return (lambda t: self.all_reduce(t.clone())) if self.enabled else None

    def gradient_sync(self):
        """What sums the gradients of an optimizer step over the processes: :meth:`sync_gradients` with
        replicated weights, None in a single process or under FSDP2 (whose backward reduce-scatters them)."""
        return self.sync_gradients if self.enabled and not self.fsdp else None

    def sync_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every gradient over the ranks with one flat all-reduce."""
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset: offset + n].view_as(g).clone()
            offset += n

    def reduce_metrics(self, metrics: dict[str, Metric | float]) -> dict[str, Metric]:
        """Combine one step's metrics over ranks, each by its own reduction (``metrics.py``)."""
        if not self.enabled:
            return reduce([metrics])
        gathered: list[dict] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(gathered, dict(metrics))
        return reduce(gathered)

    def gather_objects(self, obj) -> list:
        """Every rank's ``obj``, in rank order (``[obj]`` in a single process)."""
        if not self.enabled:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank (keeps collective decisions in step)."""
        return bool(self.all_reduce(torch.tensor(int(flag)), "max")) if self.enabled else flag

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def shutdown(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def init_distributed(device_name: str, *, fsdp: bool = False) -> tuple[DistContext, torch.device | None]:
    """Join the process group started by the launcher, if any; returns the context and the device
    this rank should use (None: decide from the config as in a single process). ``fsdp``:
    ``parallel.fsdp`` (a launcher that asks for FSDP2 without it is an error)."""
    fsdp_mod.check_launcher(fsdp)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(), None
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    return DistContext(rank=rank, world_size=world, local_rank=local, fsdp=fsdp), device
