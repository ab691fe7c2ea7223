"""Inference servers in the configuration: the ``rollout.backend`` grammar (AReaL's allocation strings) and the
rules that span ``rollout.*`` and ``actor.weight_update_*``. Nothing here imports torch; what needs the machine
(its cores and GPUs, vLLM, the collective backends) is checked where the engine is bound
(``components/rollout.py``), also before any model loads.

``rollout.backend`` is ``hf`` or ``vllm`` (the engine inside the trainer's processes), or
``<engine>:d<N>p<P>t<T>``: ``N`` server processes of that engine beside the trainer, each with tensor parallelism
``T`` (``P``, pipeline parallelism, must be 1). ``rollout.server_addrs`` instead names servers someone else started
(``python -m areal_trainer.rollout.servers``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SERVER_ENGINES = ("hf", "vllm")
WEIGHT_UPDATE_MODES = ("disk", "xccl")
_GRAMMAR = re.compile(r"^(?P<engine>[a-z]+)[:.]d(?P<d>\d+)p(?P<p>\d+)t(?P<t>\d+)$")
_ADDRESS = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d+)$")


@dataclass(frozen=True)
class ServerBackend:
    """A parsed ``<engine>:d<N>p<P>t<T>``."""

    engine: str
    count: int
    pp: int
    tp: int


def is_server_spec(value: object) -> bool:
    return isinstance(value, str) and (":" in value or "." in value)


def parse_backend(value: str) -> tuple[ServerBackend | None, list[str]]:
    """``(backend, problems)`` of a ``rollout.backend`` written as an allocation string."""
    m = _GRAMMAR.match(value.strip())
    if not m:
        return None, [f"rollout.backend: got {value!r}; write hf or vllm (in the trainer's processes), or "
                      "<engine>:d<servers>p1t<tensor parallel>, e.g. vllm:d2p1t1 for two vLLM servers."]
    b = ServerBackend(m["engine"], int(m["d"]), int(m["p"]), int(m["t"]))
    p = []
    if b.engine not in SERVER_ENGINES:
        p.append(f"rollout.backend={value}: unknown engine {b.engine!r}; servers run hf or vllm "
                 f"(e.g. vllm:d{b.count}p{b.pp}t{b.tp}).")
    if b.count < 1 or b.tp < 1:
        p.append(f"rollout.backend={value}: d (servers) and t (tensor parallelism) must be >= 1.")
    if b.pp != 1:
        p.append(f"rollout.backend={value}: pipeline parallelism (p={b.pp}) is not supported by the servers; "
                 f"use p1 (e.g. {b.engine}:d{b.count}p1t{b.tp}).")
    if b.engine == "hf" and b.tp > 1 and b.engine in SERVER_ENGINES:
        p.append(f"rollout.backend={value}: the hf engine has no tensor parallelism; use t1 (more servers: "
                 f"hf:d{b.count * b.tp}p1t1), or vllm:d{b.count}p1t{b.tp}.")
    return (b if not p else None), p


def address_problems(key: str, addresses: object) -> list[str]:
    if not isinstance(addresses, list | tuple):
        return [f"{key}: got {addresses!r}; give a list of host:port, e.g. {key}='[127.0.0.1:8001,127.0.0.1:8002]'."]
    p = []
    for a in addresses:
        m = _ADDRESS.match(a) if isinstance(a, str) else None
        if not m or not 0 < int(m["port"]) < 65536:
            p.append(f"{key}: the entry {a!r} is not host:port (e.g. 127.0.0.1:8001 or [::1]:8001).")
    if len(set(map(str, addresses))) != len(addresses):
        p.append(f"{key}: {sorted(str(a) for a in addresses if list(addresses).count(a) > 1)[0]} is listed twice.")
    return p


def server_problems(cfg) -> list[str]:
    """Rules spanning ``rollout.backend``, ``rollout.server_addrs`` and ``actor.weight_update_*``."""
    r, a = cfg.rollout, cfg.actor
    p: list[str] = []
    spec = is_server_spec(r.backend)
    if spec:
        p += parse_backend(r.backend)[1]
    p += address_problems("rollout.server_addrs", list(r.server_addrs))
    if spec and r.server_addrs:
        p.append(f"rollout.backend={r.backend} starts servers and rollout.server_addrs names running ones; set one: "
                 f"rollout.server_addrs=[] to start them, or rollout.backend={r.backend.split(':')[0]} to use those.")
    if not (spec or r.server_addrs):
        return p
    if r.max_head_offpolicyness > 0 and r.offpolicy_mode == "lagged" and r.lagged_switch_prob > 0 and (
            a.weight_update_mode != "disk"):
        p.append("rollout.lagged_switch_prob > 0 on inference servers needs actor.weight_update_mode=disk (a switch "
                 "inside a generate call loads weights the server has read ahead).")
    return p


def using_servers(cfg) -> bool:
    return is_server_spec(cfg.rollout.backend) or bool(cfg.rollout.server_addrs)
