"""Pushing the trainer's weights to the inference servers (``actor.weight_update_mode``).

* ``disk``: the weights are written as safetensors files into a new directory under ``actor.weight_update_dir``
  (``v<version>.partial``, renamed to ``v<version>`` once complete, so a server never reads a half-written
  version), then every server is asked to load it; the previous version's directory is removed. Servers must see
  the same file system (one machine, or a shared mount).
* ``xccl``: a collective group of the trainer and the servers (``group.py``): the weights' list goes over HTTP,
  the tensors by broadcast in buckets, NCCL between GPUs, gloo on CPU.

Either way one update has ``actor.weight_update_timeout`` seconds in all: a server that has not taken the weights by
then fails the run with one line naming the server, the mode and how far the update got; nothing waits forever.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait

import httpx
import torch

from ...errors import UserError
from ...fsdp import WeightStream
from ..engines.weights import checkpoint_weights
from .group import BUCKET_BYTES, WeightGroup, metas_of, plan_buckets


class UpdateFailed(UserError):
    """A weight update did not reach every server in time."""


class Unreachable(Exception):
    """Servers that refused the connection (gone): the caller marks them down and updates the others."""

    def __init__(self, addresses: Sequence[str]):
        super().__init__(", ".join(addresses))
        self.addresses = list(addresses)


class _Pusher:
    mode = ""

    def __init__(self, *, timeout: float, bucket_bytes: int = BUCKET_BYTES):
        self.timeout, self.bucket_bytes = float(timeout), int(bucket_bytes)
        self.http = httpx.Client(timeout=httpx.Timeout(self.timeout, connect=10.0))
        self.last_seconds = 0.0
        self.last_bytes = 0
        self.stage = ""

    def _post_all(self, addresses: Sequence[str], route: str, body: dict, deadline: float) -> list[str]:
        """POST ``body`` to every server at once; the servers that refused the connection (gone). Raises
        :class:`UpdateFailed` naming the first that took too long or answered with an error."""
        def one(address: str) -> bool:
            left = max(0.1, deadline - time.time())
            try:
                r = self.http.post(f"http://{address}{route}", json=body, timeout=left)
            except httpx.TimeoutException:
                raise UpdateFailed(self._failed(address, f"no answer within actor.weight_update_timeout="
                                                         f"{self.timeout:g} s")) from None
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                return False  # the server is gone (refused, or closed the connection without answering)
            except httpx.TransportError as e:
                raise UpdateFailed(self._failed(address, f"{type(e).__name__}: {e}")) from None
            if r.status_code != 200:
                raise UpdateFailed(self._failed(address, f"HTTP {r.status_code}: {r.text[:300]}"))
            return True

        with ThreadPoolExecutor(max_workers=max(1, len(addresses))) as pool:
            answered = [pool.submit(one, a) for a in addresses]
            return [a for a, f in zip(addresses, answered) if not f.result()]

    def _failed(self, address: str, why: str) -> str:
        return (f"weight update (actor.weight_update_mode={self.mode}) to inference server {address} failed "
                f"{self.stage}: {why}")

    def close(self) -> None:
        self.http.close()


def _tensors(pairs):
    for _, t in pairs:
        yield t


def _pairs(model):
    weights = checkpoint_weights(model)
    return weights.items() if isinstance(weights, dict) else weights


class DiskPusher(_Pusher):
    """``actor.weight_update_mode=disk`` (see the module docstring)."""

    mode = "disk"

    def __init__(self, directory: str, **kwargs):
        super().__init__(**kwargs)
        self.directory = directory
        self.current: str | None = None

    def write(self, model, name: str) -> str:
        """The weights as safetensors files of at most ``bucket_bytes`` each, in ``<directory>/<name>``."""
        from safetensors.torch import save_file

        final, partial = os.path.join(self.directory, name), os.path.join(self.directory, name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        part: dict[str, torch.Tensor] = {}
        size = files = total = 0

        def flush() -> None:
            nonlocal part, size, files
            if part:
                save_file(part, os.path.join(partial, f"model-{files:05d}.safetensors"))
                files, part, size = files + 1, {}, 0

        for key, tensor in _pairs(model):
            t = tensor.detach().to("cpu").contiguous().clone()  # a tied tensor is saved under both names
            if size and size + t.nbytes > self.bucket_bytes:
                flush()
            part[key], size, total = t, size + t.nbytes, total + t.nbytes
        flush()
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        self.last_bytes = total
        return final

    def push(self, model, version: int, addresses: Sequence[str]) -> list[str]:
        """Write, then have every server load; the servers found gone (the others have the weights)."""
        t0 = time.time()
        deadline = t0 + self.timeout
        self.stage = f"while writing v{version} to {self.directory}"
        try:
            path = self.write(model, f"v{version}")
        except OSError as e:
            raise UpdateFailed(f"weight update (actor.weight_update_mode=disk) could not write to {self.directory}: "
                               f"{e}; set actor.weight_update_dir to a writable directory the servers can read.") \
                from None
        self.stage = f"after writing v{version} ({self.last_bytes / 2 ** 20:.1f} MiB in {time.time() - t0:.1f} s)"
        gone = self._post_all(addresses, "/update_weights/disk", {"path": path, "version": version}, deadline)
        previous, self.current = self.current, path
        if previous and previous != path:
            shutil.rmtree(previous, ignore_errors=True)
        self.last_seconds = time.time() - t0
        return gone

    def schedule(self, model, version: int, after_tokens: int, addresses: Sequence[str]) -> None:
        path = self.write(model, f"scheduled-v{version}")
        self.stage = f"while scheduling v{version}"
        self._post_all(addresses, "/schedule_update", {"path": path, "version": version,
                                                       "after_tokens": after_tokens}, time.time() + self.timeout)

    def catch_up(self, address: str, version: int) -> None:
        """Bring a restarted server to the current weights (the last version written)."""
        if self.current is not None:
            self.stage = f"while bringing a restarted server to v{version}"
            if self._post_all([address], "/update_weights/disk", {"path": self.current, "version": version},
                              time.time() + self.timeout):
                raise Unreachable([address])


def unwritable(path: str) -> str | None:
    """Why weight updates cannot be written under ``path`` (it is made if missing), or None."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".probe-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class GroupPusher(_Pusher):
    """``actor.weight_update_mode=xccl`` (see the module docstring). The group is formed at the first push and
    again whenever the set of servers changes; ``backend``: gloo or nccl."""

    mode = "xccl"

    def __init__(self, *, backend: str, host: str = "127.0.0.1", **kwargs):
        super().__init__(**kwargs)
        self.backend, self.host = backend, host
        self.group: WeightGroup | None = None
        self.members: tuple[str, ...] = ()
        self._forms = 0

    def _form(self, addresses: Sequence[str], deadline: float) -> None:
        port, self._forms = free_port(self.host), self._forms + 1
        name = f"areal-weights-{os.getpid()}-{self._forms}"
        bodies = {a: {"host": self.host, "port": port, "rank": i + 1, "world_size": len(addresses) + 1,
                      "backend": self.backend, "timeout": self.timeout, "group": name}
                  for i, a in enumerate(addresses)}
        self.stage = "while forming the weight group"
        with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
            joins = [pool.submit(self._post_all, [a], "/update_weights/group/init", b, deadline)
                     for a, b in bodies.items()]
            try:
                self.group = WeightGroup(host=self.host, port=port, rank=0, world_size=len(addresses) + 1,
                                         backend=self.backend, timeout=max(1.0, deadline - time.time()), group=name)
            except Exception as e:  # noqa: BLE001 - a server that did not join: gone, or it said why
                gone = [a for f in joins if f.done() and f.exception() is None for a in f.result()]
                if gone:
                    raise Unreachable(gone) from None
                for f in joins:
                    if f.done() and f.exception() is not None:
                        raise f.exception() from None
                raise UpdateFailed(self._failed(", ".join(addresses), f"{type(e).__name__}: {e}")) from None
            gone = [a for f in joins for a in f.result()]
            if gone:
                self.group = None
                raise Unreachable(gone)
        self.members = tuple(addresses)

    def push(self, model, version: int, addresses: Sequence[str]) -> list[str]:
        """Send to every server; raises :class:`Unreachable` when one is gone (the caller forms the group again
        without it), :class:`UpdateFailed` when one is too slow or fails."""
        t0 = time.time()
        deadline = t0 + self.timeout
        if self.group is None or tuple(addresses) != self.members:
            self._form(addresses, deadline)
        weights = checkpoint_weights(model)
        if isinstance(weights, WeightStream):  # gathered from the shards bucket by bucket, as it is sent
            pairs, metas = weights, metas_of(weights.metas())
        else:
            pairs = list(weights.items() if isinstance(weights, dict) else weights)
            metas = metas_of(pairs)
        buckets = plan_buckets(metas, self.bucket_bytes)
        body = {"version": version, "tensors": [[m.name, list(m.shape), m.dtype] for m in metas], "buckets": buckets}
        self.stage = f"while sending v{version} (0 of {len(buckets)} buckets)"
        with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
            loads = [pool.submit(self._post_all, [a], "/update_weights/group", body, deadline) for a in addresses]

            def progress(done: int, total: int) -> None:
                self.stage = f"while sending v{version} ({done} of {total} buckets)"

            why = None
            try:
                self.group.send(_tensors(pairs), buckets, progress)
            except Exception as e:  # noqa: BLE001 - a peer gone or too slow: the group is unusable now
                why = f"{type(e).__name__}: {e}"  # (e, whose traceback holds the last broadcast, goes here)
            if why is not None:
                # Leaving the group fails the broadcast the other servers are waiting in, so their requests
                # end now instead of when the group's timeout passes (a server killed mid-update left the
                # others, and this update, waiting for actor.weight_update_timeout).
                self.group.close()
                self.group = None
                wait(loads, timeout=max(0.1, deadline - time.time()))
                gone = [a for f in loads if f.done() and f.exception() is None for a in f.result()]
                if gone:
                    raise Unreachable(gone)
                raise UpdateFailed(self._failed(", ".join(addresses), why))
            done, _ = wait(loads, timeout=max(0.1, deadline - time.time()))
            for f in loads:
                if f not in done:
                    raise UpdateFailed(self._failed(addresses[loads.index(f)], "it had the weights but did not "
                                                    "confirm loading them in time"))
            gone = [a for f in loads for a in f.result()]
        if gone:
            self.group = None
            raise Unreachable(gone)
        self.last_bytes = sum(m.nbytes for m in metas)
        self.last_seconds = time.time() - t0
        return []

    def schedule(self, model, version: int, after_tokens: int, addresses: Sequence[str]) -> None:
        raise UserError("rollout.lagged_switch_prob > 0 with inference servers needs actor.weight_update_mode=disk.")

    def catch_up(self, address: str, version: int) -> None:
        raise UpdateFailed("a restarted server joins the weight group at the next update")
