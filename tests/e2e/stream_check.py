"""Worker for the weight-stream test: the built-in tiny policy sharded with FSDP2 over the launcher's
processes; the main one pushes its weights to two pretend servers through the real ``ServerEngine`` and
rank pusher. The first push attempt reads two tensors and finds its server gone (as a weight broadcast
does when a server dies mid-update); the engine retries on the other server, which reads every tensor.
The other processes follow each pass. Rank 0 writes what the second attempt received, the model's full
state dict (gathered as a checkpoint gathers it) and how many tensors had been gathered when the first
attempt had read two, to ``<out>/stream.pt``; every rank writes how many passes it walked to
``<out>/rank<r>.pt``."""

import sys

import torch
from torch.distributed.tensor import DTensor

from areal_trainer import fsdp
from areal_trainer.dist import init_distributed
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.servers.client import ServerEngine
from areal_trainer.rollout.servers.spec import _RankPusher
from areal_trainer.rollout.servers.weights import Unreachable


class PretendServers:
    """A pusher whose first server goes away after two tensors; the next attempt takes them all."""

    def __init__(self):
        self.attempts: list[list[str]] = []
        self.received: dict[str, torch.Tensor] = {}
        self.gathered_after_two = -1

    def push(self, model, version, addresses):
        self.attempts.append(list(addresses))
        stream = iter(model)
        if len(self.attempts) == 1:
            next(stream), next(stream)
            self.gathered_after_two = GATHERS[0]
            raise Unreachable([addresses[0]])
        self.received = {name: t.clone() for name, t in stream}
        return []

    def catch_up(self, address, version):
        pass


GATHERS = [0]
_full_tensor = DTensor.full_tensor


def _counted_full_tensor(self, *args, **kwargs):
    GATHERS[0] += 1
    return _full_tensor(self, *args, **kwargs)


def main(out: str) -> None:
    ctx, _ = init_distributed("cpu", fsdp=True)
    model = build_model("builtin:tiny", build_tokenizer(), seed=0)
    if ctx.fsdp:
        fsdp.shard_model(model, fsdp.device_mesh(torch.device("cpu"), ctx.world_size))
    DTensor.full_tensor = _counted_full_tensor
    inner = PretendServers()
    pusher = _RankPusher(inner, ctx.rank == 0)
    passes = [0]
    follow = fsdp.WeightStream.follow

    def counted(stream):
        passes[0] = follow(stream)
        return passes[0]

    fsdp.WeightStream.follow = counted
    engine = ServerEngine(["a:1", "b:2"], pusher=pusher, seed=0, request_timeout=5, retries=0, barrier=ctx.barrier)
    engine.update_weights(fsdp.WeightStream(model), 1)
    engine.close()
    full = fsdp.full_state_dict(model)  # collective; on rank 0
    if ctx.rank == 0:
        torch.save({"received": inner.received, "full": full, "attempts": inner.attempts,
                    "sharded": fsdp.is_sharded(model), "version": engine.version,
                    "gathered_after_two": inner.gathered_after_two}, f"{out}/stream.pt")
    torch.save({"passes": passes[0]}, f"{out}/rank{ctx.rank}.pt")
    ctx.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
