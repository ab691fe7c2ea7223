"""Start an inference server: ``python -m areal_trainer.rollout.servers --model DIR [options]``.

The trainer starts these itself for ``rollout.backend=<engine>:d<N>p1t<T>``; start them by hand for
``rollout.server_addrs`` (one per host:port). ``DIR`` holds the model's ``config.json`` and tokenizer files (its
weights are not read: the trainer pushes its own before the first request, version 0), or it is a model the
loaders know (``builtin:tiny``, a Hugging Face directory). The server prints ``areal-server listening on
http://HOST:PORT`` once it accepts requests and writes the port to ``--port-file`` if given.

    python -m areal_trainer.rollout.servers --model outputs/run/servers/model --engine vllm --port 8001
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m areal_trainer.rollout.servers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory (config and tokenizer) or built-in name")
    p.add_argument("--engine", default="hf", choices=("hf", "vllm"), help="the engine inside (default hf)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--dtype", default="float32", help="precision of the engine's weights")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--interruptible", action="store_true", help="weight updates stop generation at a token")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per generate call of the hf engine")
    p.add_argument("--engine-kwargs", default="{}", help="JSON keyword arguments of the engine (vllm.LLM's)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    return p.parse_args(argv)


def build_engine(args: argparse.Namespace):
    """The engine over a model of ``args.model``'s architecture (random weights until the first push)."""
    import torch

    from ...model.load import load_tokenizer, param_dtype
    from ..engines.backends import ENGINES
    from ..engines.hf import HFEngine

    tokenizer = load_tokenizer(args.model, key="--model")
    device = torch.device(args.device)
    dtype = param_dtype(args.dtype)
    model = _architecture(args.model, tokenizer, dtype, device, meta=args.engine == "vllm", seed=args.seed)
    kwargs = json.loads(args.engine_kwargs)
    if args.engine == "hf":  # the server's model is the engine's own: no second copy
        return HFEngine(model, tokenizer, device=device, batch_size=args.batch_size, interruptible=args.interruptible,
                        stoppable=True, share_prefill=True, **kwargs)
    return ENGINES[args.engine].make(model, tokenizer, device=device, autocast_dtype=None, seed=args.seed,
                                     dtype=None, batch_size=args.batch_size, interruptible=args.interruptible,
                                     share_prefill=True, stoppable=True, **kwargs)


def _architecture(path: str, tokenizer, dtype, device, *, meta: bool, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ...model import builtin

    if builtin.is_builtin(path):
        config = builtin.build_config(path, tokenizer)
    else:
        config = AutoConfig.from_pretrained(path)
    if meta:  # vLLM builds its own weights from the config (dummy load); nothing is allocated here
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
    return model.eval().requires_grad_(False)


def _watch_parent(pid: int) -> None:
    """End this server when the process that started it is gone (a crash or SIGKILL leaves no orphan): an orphan is
    handed to another parent."""
    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(1)

    threading.Thread(target=watch, name="areal-server-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.parent_pid:
        _watch_parent(args.parent_pid)
    import uvicorn

    from .app import InferenceServer

    engine = build_engine(args)
    server = InferenceServer(engine, args.engine)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(server.app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                            loop="asyncio", timeout_keep_alive=600)
    uv = uvicorn.Server(config)
    threading.Thread(target=_announce, args=(uv, args, port), daemon=True).start()
    try:
        uv.run(sockets=[sock])
    finally:
        abort = getattr(engine, "abort", None)
        if callable(abort):
            abort()
        close = getattr(engine, "close", None)
        if callable(close):
            close()


def _announce(uv, args: argparse.Namespace, port: int) -> None:
    while not uv.started:
        time.sleep(0.01)
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    print(f"areal-server listening on http://{args.host}:{port} (engine {args.engine}, pid {os.getpid()})",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
