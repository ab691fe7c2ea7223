"""An inference server: one rollout engine (``hf`` or ``vllm``) behind the HTTP routes of ``protocol.py``.

The engine is the in-process one (``rollout/engines/``), so a server samples exactly as the trainer's own engine
would: the same per-token log-probs, the same stop rules, the same partial rollouts. Generate calls run one at a
time in a worker thread (a seeded call seeds the process's sampler first, which only one call may use at a time);
a weight update runs beside them and, on an interruptible engine, stops the generation in flight at the next
token, loads the weights, and lets it continue under them (each token keeps its version).

Weight loads stream: from disk, one safetensors file's tensors at a time; from the weight group, one bucket at a
time. The engine's gate holds generation for the whole load, so no token is sampled with half-new weights.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .group import TensorMeta, WeightGroup
from .protocol import error_body, gconfig_from_json, generation_to_json


class BadRequest(Exception):
    """A request the server refuses (400), with the reason the client reports."""


def disk_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of every ``*.safetensors`` file under ``path``, one file open at a time."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise BadRequest(f"no *.safetensors file in {path}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


class InferenceServer:
    """The routes over ``engine``. ``name``: the engine's backend name, reported by ``/health``."""

    def __init__(self, engine, name: str):
        self.engine, self.name = engine, name
        self._generate_lock = threading.Lock()
        self._group: WeightGroup | None = None
        self.requests = 0
        self.started = time.time()
        self.app = Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/generate", self.generate, methods=["POST"]),
            Route("/update_weights/disk", self.update_from_disk, methods=["POST"]),
            Route("/update_weights/group/init", self.group_init, methods=["POST"]),
            Route("/update_weights/group", self.update_from_group, methods=["POST"]),
            Route("/schedule_update", self.schedule_update, methods=["POST"]),
            Route("/abort", self.abort, methods=["POST"]),
        ])

    # -- routes ----------------------------------------------------------------------------------------
    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "version": self.engine.version, "engine": self.name, "pid": os.getpid(),
                             "requests": self.requests, "uptime_s": time.time() - self.started})

    async def generate(self, request: Request) -> JSONResponse:
        async def run(body: dict) -> dict:
            prompts = body.get("prompts")
            if not isinstance(prompts, list) or not all(
                    isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts):
                raise BadRequest("'prompts' must be a list of non-empty lists of token ids")
            try:
                gconfig = gconfig_from_json(body.get("gconfig") or {})
            except ValueError as e:
                raise BadRequest(str(e)) from None
            seed = body.get("seed")
            if seed is not None and not isinstance(seed, int):
                raise BadRequest("'seed' must be an integer or null")
            gens = await asyncio.to_thread(self._generate, prompts, gconfig, seed)
            self.requests += 1
            return {"generations": [generation_to_json(g) for g in gens], "version": self.engine.version}

        return await _answer(request, run)

    def _generate(self, prompts: list[list[int]], gconfig, seed: int | None) -> list:
        with self._generate_lock:
            if seed is not None:
                torch.manual_seed(seed)
            return self.engine.generate(prompts, gconfig)

    async def update_from_disk(self, request: Request) -> JSONResponse:
        async def run(body: dict) -> dict:
            path, version = _path_and_version(body)
            t0 = time.time()
            await asyncio.to_thread(self.engine.update_weights, disk_weights(path), version)
            return {"version": version, "seconds": time.time() - t0}

        return await _answer(request, run)

    async def group_init(self, request: Request) -> JSONResponse:
        async def run(body: dict) -> dict:
            try:
                kwargs = {k: body[k] for k in ("host", "port", "rank", "world_size", "backend", "timeout")}
            except KeyError as e:
                raise BadRequest(f"missing {e}") from None
            if self._group is not None:
                self._group.close()
            self._group = await asyncio.to_thread(lambda: WeightGroup(**kwargs, group=body.get("group", "w")))
            return {"rank": self._group.rank}

        return await _answer(request, run)

    async def update_from_group(self, request: Request) -> JSONResponse:
        async def run(body: dict) -> dict:
            if self._group is None:
                raise BadRequest("no weight group: POST /update_weights/group/init first")
            version = body.get("version")
            if not isinstance(version, int):
                raise BadRequest("'version' must be an integer")
            metas = [TensorMeta(n, tuple(s), d) for n, s, d in body.get("tensors", [])]
            buckets = [int(b) for b in body.get("buckets", [])]
            if sum(buckets) != len(metas):
                raise BadRequest(f"buckets {buckets} do not add up to the {len(metas)} tensors sent")
            t0 = time.time()
            stream = self._group.receive(metas, buckets)
            await asyncio.to_thread(self.engine.update_weights, stream, version)
            return {"version": version, "seconds": time.time() - t0}

        return await _answer(request, run)

    async def schedule_update(self, request: Request) -> JSONResponse:
        async def run(body: dict) -> dict:
            path, version = _path_and_version(body)
            after = body.get("after_tokens")
            if not isinstance(after, int) or after < 1:
                raise BadRequest("'after_tokens' must be an integer >= 1")
            if not callable(getattr(self.engine, "schedule_update", None)):
                raise BadRequest(f"the {self.name} engine cannot switch weights inside a generate call")
            weights = dict(await asyncio.to_thread(lambda: list(disk_weights(path))))
            self.engine.schedule_update(after, weights, version)
            return {"version": version}

        return await _answer(request, run)

    async def abort(self, request: Request) -> JSONResponse:
        abort = getattr(self.engine, "abort", None)
        if callable(abort):
            abort()
        return JSONResponse({"aborted": True})


def _path_and_version(body: dict) -> tuple[str, int]:
    path, version = body.get("path"), body.get("version")
    if not isinstance(path, str) or not os.path.isdir(path):
        raise BadRequest(f"'path' must be a directory this server can read, got {path!r}")
    if not isinstance(version, int):
        raise BadRequest("'version' must be an integer")
    return path, version


async def _answer(request: Request, run) -> JSONResponse:
    """Parse the JSON body, run the route, and turn failures into JSON errors the client reports."""
    try:
        body = json.loads(await request.body() or b"{}")
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return JSONResponse(await run(body))
    except (BadRequest, json.JSONDecodeError, UnicodeDecodeError) as e:
        return JSONResponse(error_body(str(e), "invalid_request"), status_code=400)
    except Exception as e:  # noqa: BLE001 - the client names the server and the failure
        return JSONResponse(error_body(f"{type(e).__name__}: {e}"), status_code=500)


def problem_of(answer: Any) -> str:
    """The message of an error body, for a client's report."""
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("message"))
    return repr(answer)[:200]
