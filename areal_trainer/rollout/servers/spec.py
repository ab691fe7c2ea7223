"""The server backend as a rollout engine entry (``rollout/engines/backends.py::EngineSpec``), bound once from
``rollout.backend=<engine>:d<N>p1t<T>`` or ``rollout.server_addrs`` (``components/rollout.py``).

Its ``make`` runs on every trainer process when the rollout is built: the main process writes the model's
architecture and tokenizer (no weights) to ``<run dir>/servers/model``, starts the servers on it (``fleet.py``) and
waits until they listen; every process then gets the servers' addresses. Only the main process pushes weights;
the others wait for it at each update (a barrier), so no process samples with the old weights after an update.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from ...errors import UserError
from ...fsdp import WeightStream
from ..engines.backends import EngineSpec
from ..limits import positions_of
from .client import ServerEngine
from .fleet import FleetPlan, ServerFleet
from .group import backend_for
from .weights import DiskPusher, GroupPusher, unwritable


@dataclass(frozen=True)
class ServerSettings:
    """``rollout.*`` and ``actor.weight_update_*`` as the servers need them."""

    engine: str
    count: int = 0
    tp: int = 1
    addresses: tuple[str, ...] = ()
    setup_timeout: float = 300.0
    request_timeout: float = 3600.0
    retries: int = 3
    weight_mode: str = "disk"
    weight_timeout: float = 600.0
    weight_dir: str | None = None
    engine_kwargs: dict = field(default_factory=dict)

    @property
    def own(self) -> bool:
        """Whether the run starts its servers itself."""
        return self.count > 0


class _RankPusher:
    """The main process pushes; the others only wait for it (``ServerEngine.barrier`` after each update). Weights
    gathered from FSDP2 shards (a :class:`WeightStream`) need every process for each pass the main one makes:
    the others follow until :meth:`settle`, which ends the update (after any retries)."""

    def __init__(self, inner, is_main: bool):
        self.inner, self.is_main = inner, is_main

    def push(self, model, version, addresses):
        if isinstance(model, WeightStream):
            model.lead = self.is_main
            if not self.is_main:
                model.follow()
        return self.inner.push(model, version, addresses) if self.is_main else []

    def settle(self, model) -> None:
        if isinstance(model, WeightStream) and self.is_main:
            model.finish()

    def schedule(self, model, version, after, addresses):
        if isinstance(model, WeightStream):
            model.lead = self.is_main
            if not self.is_main:
                model.follow()
                return
            try:
                self.inner.schedule(model, version, after, addresses)
            finally:
                model.finish()
        elif self.is_main:
            self.inner.schedule(model, version, after, addresses)

    def catch_up(self, address, version):
        if self.is_main:
            self.inner.catch_up(address, version)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class ServerRollout(ServerEngine):
    """A :class:`ServerEngine` that owns what the run started for it (the fleet, the model directory)."""

    fleet: ServerFleet | None = None
    work_dir: str | None = None

    def close(self) -> None:
        super().close()
        if self.fleet is not None:
            self.fleet.stop()
        self.pusher.close()

    def abort(self) -> None:
        """Nothing to stop here: a request in flight ends with its server (``close``)."""


def make_server_engine(model, tokenizer, *, device, seed, dtype, interruptible, settings: ServerSettings,
                       work_dir: str, dist, **_unused) -> ServerRollout:
    """The engine (see the module docstring); ``dtype``: the rollout's precision (None: the policy's)."""
    s = settings
    servers_dir = os.path.join(work_dir, "servers")
    fleet = None
    addresses: list[str] = list(s.addresses)
    if dist.is_main:
        os.makedirs(servers_dir, exist_ok=True)
        if s.own:
            model_dir = os.path.join(servers_dir, "model")
            shutil.rmtree(model_dir, ignore_errors=True)
            model.config.save_pretrained(model_dir)  # the architecture only: the weights are pushed
            tokenizer.save_pretrained(model_dir)
            gpus = device.type == "cuda"
            plan = FleetPlan(engine=s.engine, count=s.count, tp=s.tp, model_dir=model_dir,
                             dtype=str(dtype or model.dtype).removeprefix("torch."),
                             device="cuda" if gpus else "cpu", seed=seed, interruptible=interruptible,
                             engine_kwargs=dict(s.engine_kwargs), first_gpu=dist.world_size if gpus else 0)
            fleet = ServerFleet(plan, servers_dir)
            fleet.start()
            try:
                addresses = fleet.wait_ready(s.setup_timeout)
            except BaseException:
                fleet.stop()
                raise
    addresses = dist.gather_objects(addresses)[0]
    if s.weight_mode == "disk":
        inner = DiskPusher(s.weight_dir or os.path.join(servers_dir, "weights"), timeout=s.weight_timeout)
        if dist.is_main:
            _check_dir(inner.directory)
    else:
        inner = GroupPusher(backend=backend_for(device), timeout=s.weight_timeout)
    restart = None
    if fleet is not None:
        def restart(i: int) -> str:
            fleet.restart(i, s.setup_timeout)
            return fleet.addresses[i]
    engine = ServerRollout(addresses, pusher=_RankPusher(inner, dist.is_main), barrier=dist.barrier, seed=seed,
                           rank=dist.rank, request_timeout=s.request_timeout, retries=s.retries, restart=restart,
                           max_positions=positions_of(model, tokenizer),
                           can_switch=s.engine == "hf" and s.weight_mode == "disk")
    engine.fleet, engine.work_dir = fleet, servers_dir
    if not s.own:
        try:
            engine.wait_healthy(s.setup_timeout)
        except BaseException:
            engine.close()
            raise
    return engine


def _check_dir(path: str) -> None:
    why = unwritable(path)
    if why:
        raise UserError(f"actor.weight_update_dir: cannot write weight updates to {path} ({why}); set it to a "
                        "writable directory the servers can read.")


def server_spec(settings: ServerSettings) -> EngineSpec:
    """The engine entry of the server backend for these settings."""
    def make(model, tokenizer, **kwargs):
        return make_server_engine(model, tokenizer, settings=settings, **kwargs)

    return EngineSpec(make, holds_own_weights=True, supports_fsdp=True,
                      can_switch_mid_call=settings.engine == "hf" and settings.weight_mode == "disk",
                      servers=True)
