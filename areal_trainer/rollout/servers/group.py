"""The ``xccl`` weight update: a collective group of its own between the trainer (rank 0) and the servers.

The group is a standalone process group (gloo on CPU, NCCL on GPUs) over a TCP store the trainer hosts, apart from
the trainer's own data-parallel group, so neither waits on the other. An update sends the weights' list first
(names, shapes, dtypes, over HTTP), then broadcasts them in buckets of at most ``bucket_bytes``, each one flat
buffer of one dtype: a receiver holds one bucket at a time, and a sender reads its tensors one bucket at a time
(under FSDP2 a bucket's shards are gathered when it is sent), so no side ever holds a second full copy.
Every collective has the group's timeout: a peer that is gone fails the update in that time, never hangs it.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

BUCKET_BYTES = 256 * 2 ** 20
"""Default bucket size of a weight broadcast (256 MiB)."""


def backend_for(device: torch.device | str) -> str:
    """``nccl`` for CUDA tensors, ``gloo`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def backend_problem(backend: str) -> str | None:
    """Why the collective ``backend`` cannot be used here, or None."""
    if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        return "NCCL needs CUDA GPUs and torch built with NCCL"
    if backend == "gloo" and not dist.is_gloo_available():
        return "this torch build has no gloo backend"
    if backend not in ("gloo", "nccl"):
        return f"unknown collective backend {backend!r} (gloo or nccl)"
    return None


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


def plan_buckets(metas: Sequence[TensorMeta], bucket_bytes: int = BUCKET_BYTES) -> list[int]:
    """How many consecutive tensors each bucket holds: a bucket is one dtype and at most ``bucket_bytes`` (a larger
    tensor is a bucket of its own)."""
    sizes: list[int] = []
    count = size = 0
    dtype = None
    for m in metas:
        if count and (m.dtype != dtype or size + m.nbytes > bucket_bytes):
            sizes.append(count)
            count = size = 0
        count, size, dtype = count + 1, size + m.nbytes, m.dtype
    if count:
        sizes.append(count)
    return sizes


class WeightGroup:
    """One member of a weight group. ``rank`` 0 (the trainer) hosts the store and sends; the others receive."""

    def __init__(self, *, host: str, port: int, rank: int, world_size: int, backend: str, timeout: float,
                 group: str = "areal-weights"):
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.timeout = datetime.timedelta(seconds=timeout)
        self.store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=self.timeout,
                                   wait_for_workers=False)
        prefix = dist.PrefixStore(group, self.store)
        if backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(prefix, rank, world_size)
        else:
            self.pg = dist.ProcessGroupGloo(prefix, rank, world_size, self.timeout)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def _broadcast(self, buf: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        work = self.pg.broadcast([buf], opts)
        try:
            done = work.wait(self.timeout)
        finally:
            del work  # a failed one's traceback must not keep the group's connections open (``close``)
        if not done:
            raise TimeoutError(f"a weight broadcast did not finish within {self.timeout.total_seconds():.0f} s")

    def send(self, tensors: Iterable[torch.Tensor], bucket_sizes: Sequence[int],
             progress=lambda done, total: None) -> None:
        """Broadcast ``tensors`` (in the order of the metadata sent) in buckets of ``bucket_sizes`` tensors."""
        it = iter(tensors)
        for i, count in enumerate(bucket_sizes):
            parts = [next(it).detach().reshape(-1) for _ in range(count)]
            buf = torch.cat(parts).to(self.device) if len(parts) > 1 else parts[0].to(self.device).contiguous()
            self._broadcast(buf)
            progress(i + 1, len(bucket_sizes))

    def receive(self, metas: Sequence[TensorMeta], bucket_sizes: Sequence[int]) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors, as they arrive: ``(name, tensor)`` pairs, one bucket held at a time."""
        start = 0
        for count in bucket_sizes:
            chunk = metas[start:start + count]
            start += count
            buf = torch.empty(sum(m.numel for m in chunk), dtype=getattr(torch, chunk[0].dtype), device=self.device)
            self._broadcast(buf)
            offset = 0
            for m in chunk:
                yield m.name, buf[offset:offset + m.numel].view(m.shape)
                offset += m.numel

    def close(self) -> None:
        """Leave the group: its connections close as the last reference to it goes (this one, unless a broadcast
        is still running), so the other members' broadcast in progress fails at once instead of waiting out the
        timeout."""
        self.pg = None
        self.store = None


def metas_of(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    return [TensorMeta(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named]
