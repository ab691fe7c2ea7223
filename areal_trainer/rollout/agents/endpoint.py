"""An OpenAI-compatible HTTP endpoint, so agents in another process (or language) can be trained.

Such an agent gets ``base_url`` and an ``api_key`` and talks to ``POST /v1/chat/completions`` as it
would to OpenAI. Each episode gets its own random key from ``open_episode(handler)``: the key
both authenticates and routes, so concurrent episodes never see each other's requests, and a key
stops working at ``close_episode`` (401), which cuts off an agent that outlives its episode.
``POST /rl/set_reward`` lets the agent report a reward (``{"completion_id": ..., "reward": ...}``,
or without the id for the episode's last call); it is served under ``/v1`` too, because clients
join paths to ``base_url`` (the ``openai`` client's ``client.post("/rl/set_reward", ...)`` requests
``/v1/rl/set_reward``). ``GET /v1/models`` lists one model, ``policy``, but any model name is
accepted in requests.

Threads and loops. The server (Starlette on uvicorn) runs its own event loop in a daemon thread
named ``areal-endpoint-<port>``. A handler's methods are called there: a coroutine function is
awaited on that loop (it must not block it); a plain function is run in a worker thread, so it may
block, e.g. on ``asyncio.run_coroutine_threadsafe(...).result()``. ``LoopHandler`` wraps a handler
whose coroutines run on another loop. (The trainer serves on the episodes' loop: ``loop_endpoint.py``.)

Errors are OpenAI-style JSON (``{"error": {...}}``) so clients raise their usual exceptions:
401 for a missing or unknown key, 400 for a malformed body, 413 for a body over ``MAX_BODY_BYTES`` (refused
before it is read whole), 404 for an unknown route, a handler's ``RequestError`` with its status, and 500
(with the exception's type and message; the traceback goes to this module's logger) for anything else a
handler raises. uvicorn's access log is off and its logging configuration is not installed.

``stop()`` waits for requests in flight for up to ``GRACE_S`` seconds, then cancels them, and
returns once the thread has ended and the port is free. The server binds 127.0.0.1 by default:
episode keys are bearer secrets sent in clear text, fine on the loopback interface only.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from areal_trainer.dtypes import fits_float32
from areal_trainer.rollout.agents.openai_types import ChatCompletion
from areal_trainer.rollout.agents.requests import ChatRequest, RequestError, parse_chat_request

logger = logging.getLogger(__name__)

MODEL_ID = "policy"
GRACE_S = 3  # how long stop() lets requests in flight finish
MAX_BODY_BYTES = 8 * 2 ** 20
"""The largest request body the endpoint reads (8 MiB: a long conversation with tools is well under 1 MiB)."""
KEEP_ALIVE_S = 600
"""How long an idle connection stays open. A client reuses its pooled connections; one the server closes at the
moment the client sends on it fails that request (``openai.APIConnectionError``). With uvicorn's default of 5 s
that hit about one request in a few hundred whenever a rollout's calls paused longer (the update between steps)."""
_ROUTES = "POST /v1/chat/completions, GET /v1/models and POST /v1/rl/set_reward (or /rl/set_reward)"


class ChatHandler(Protocol):
    async def create(self, request: ChatRequest) -> ChatCompletion: ...

    async def set_reward(self, completion_id: str | None, reward: float) -> None: ...


async def call_handler(method: Callable[..., Any], *args: Any) -> Any:
    """Await a coroutine function on this loop; run a plain function in a worker thread."""
    if inspect.iscoroutinefunction(method):
        return await method(*args)
    result = await asyncio.to_thread(method, *args)
    return await result if inspect.isawaitable(result) else result


class LoopHandler:
    """A ``ChatHandler`` that runs another handler's coroutines on ``loop`` (an event loop running
    in another thread) and awaits them from the server's loop. Cancelling the request (server
    shutdown) cancels the coroutine on ``loop`` too."""

    def __init__(self, handler: ChatHandler, loop: asyncio.AbstractEventLoop):
        self.handler, self.loop = handler, loop

    async def create(self, request: ChatRequest) -> ChatCompletion:
        return await self._on_loop(self.handler.create(request))

    async def set_reward(self, completion_id: str | None, reward: float) -> None:
        return await self._on_loop(self.handler.set_reward(completion_id, reward))

    def bad_request(self, error: RequestError) -> None:
        note = getattr(self.handler, "bad_request", None)
        if callable(note):
            self.loop.call_soon_threadsafe(note, error)

    async def _on_loop(self, coro: Any) -> Any:
        if asyncio.get_running_loop() is self.loop:  # served on the handler's own loop (LoopEndpoint)
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))


def _error(err: RequestError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


async def _read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request's body, read until ``limit`` bytes at most: a larger one is refused (413) without being
    read whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"The request body has {int(declared)} bytes; at most {limit} are accepted.")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"The request body has more than {limit} bytes; at most {limit} are accepted.")
        parts.append(chunk)
    return b"".join(parts)


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await _read_body(request)
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"The request body is not valid JSON ({e}).") from e
    if not isinstance(body, dict):
        raise RequestError(400, f"The request body must be a JSON object, got {type(body).__name__}.")
    return body


def _reward_body(body: dict[str, Any]) -> tuple[float, str | None]:
    """``(reward, completion_id)`` of a ``set_reward`` body; raises ``RequestError`` (400) naming the field."""
    reward, completion_id = body.get("reward"), body.get("completion_id")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not fits_float32(reward):
        raise RequestError(400, "Invalid value for 'reward': expected a finite number within float32, got "
                           f"{reward!r:.80}.",
                           param="reward", code="invalid_value")
    if completion_id is not None and not isinstance(completion_id, str):
        raise RequestError(400, "Invalid value for 'completion_id': expected the id of a chat "
                           f"completion (a string) or null, got {completion_id!r}.", param="completion_id")
    return float(reward), completion_id


async def _refused(handler: ChatHandler, parse: Callable[[Any], Any], body: Any) -> Any:
    """``parse(await body)``; a request it refuses is reported to the handler (its ``bad_request``, if
    any: the episode counts it) before the client gets the error."""
    try:
        return parse(await body)
    except RequestError as e:
        note = getattr(handler, "bad_request", None)
        if callable(note):
            note(e)
        raise


class EndpointServer:
    """The HTTP endpoint; see the module docstring. Usable as a context manager (start/stop)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self._requested_port = host, port
        self._port: int | None = None
        self._handlers: dict[str, ChatHandler] = {}
        self._lock = threading.Lock()  # open/close_episode run in trainer threads, lookups on the server's
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._created = int(time.time())
        self.app = self._build_app()

    # ----------------------------------------------------------------------------- lifecycle

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("EndpointServer: the port is known once start() has been called.")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        """Serve from a thread of its own; returns once the server listens."""
        if self._thread is not None:
            raise RuntimeError("EndpointServer.start(): already running; stop() it first.")
        sock = self._bind()
        self._server, self._failure = uvicorn.Server(self._config()), None
        self._thread = threading.Thread(target=self._serve, args=(self._server, sock),
                                        name=f"areal-endpoint-{self._port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"EndpointServer: the server on port {self._port} did not start "
                                   f"({self._failure!r}).") from self._failure
            time.sleep(0.01)

    def _bind(self) -> socket.socket:
        """The listening socket, bound here rather than by uvicorn so that port 0 is resolved at once and a bind
        error reaches the caller (uvicorn would sys.exit in its thread)."""
        # IPPROTO_TCP named explicitly: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets whose
        # protocol says TCP, and a response written in two parts (headers, body) would otherwise wait for the
        # client's delayed ACK, about 40 ms per request.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # rebinding after stop(), despite TIME_WAIT
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by the accepted connections
        try:
            sock.bind((self.host, self._requested_port))
        except OSError as e:
            sock.close()
            raise RuntimeError(f"EndpointServer: cannot listen on {self.host}:{self._requested_port} ({e}); "
                               "choose another port, or port=0 for a free one.") from e
        self._port = sock.getsockname()[1]
        return sock

    def _config(self) -> uvicorn.Config:
        return uvicorn.Config(self.app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                              loop="asyncio", server_header=False, timeout_graceful_shutdown=GRACE_S,
                              timeout_keep_alive=KEEP_ALIVE_S)

    async def serving(self) -> None:
        """Whether it listens, as :class:`~areal_trainer.rollout.agents.loop_endpoint.LoopEndpoint` asks."""
        if self._server is None or not self._server.started:
            raise RuntimeError("EndpointServer: start() it before handing out keys.")

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # noqa: BLE001 - SystemExit from uvicorn too; reported by start()
            self._failure = e
            logger.exception("endpoint server failed")
        finally:
            sock.close()

    def stop(self) -> None:
        """Stop serving and free the port; requests still in flight after GRACE_S are cancelled."""
        thread, server = self._thread, self._server
        if thread is None or server is None:
            return
        if threading.current_thread() is thread:
            raise RuntimeError("EndpointServer.stop() cannot be called from a request handler.")
        server.should_exit = True
        thread.join(GRACE_S + 5)
        if thread.is_alive():  # a handler ignores cancellation: stop waiting for it
            server.force_exit = True
            thread.join(5)
        if thread.is_alive():
            raise RuntimeError(f"EndpointServer: the server thread {thread.name} did not stop.")
        self._thread = self._server = None

    def __enter__(self) -> EndpointServer:
        return self.start() or self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------ episodes

    def open_episode(self, handler: ChatHandler) -> str:
        """Register ``handler`` and return the fresh API key that routes requests to it."""
        for method in ("create", "set_reward"):
            if not callable(getattr(handler, method, None)):
                raise TypeError(f"open_episode: {handler!r} has no method {method}(); a chat handler needs "
                                "create(request) and set_reward(completion_id, reward).")
        key = "sk-areal-" + secrets.token_urlsafe(24)
        with self._lock:
            self._handlers[key] = handler
        return key

    def close_episode(self, key: str) -> None:
        """Unregister the episode; its key gets 401 from now on. Closing twice is harmless."""
        with self._lock:
            self._handlers.pop(key, None)

    def _handler_for(self, request: Request) -> ChatHandler:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise RequestError(401, "Missing API key: send the header 'Authorization: Bearer <key>' with the "
                               "key of your episode (the api_key the agent was given).", code="missing_api_key")
        with self._lock:
            handler = self._handlers.get(key.strip())
        if handler is None:
            raise RequestError(401, f"Invalid API key '{key.strip()[:12]}...': it is not the key of an open "
                               "episode (the episode may have ended).", code="invalid_api_key")
        return handler

    # -------------------------------------------------------------------------------- routes

    def _build_app(self) -> Starlette:
        # Plain Starlette routes: the endpoint parses and checks its JSON itself, so a framework's request
        # validation and middleware would only add per-request work.
        routes = [Route("/v1/chat/completions", self._chat, methods=["POST"]),
                  Route("/v1/models", self._models, methods=["GET"]),
                  Route("/rl/set_reward", self._set_reward, methods=["POST"]),
                  Route("/v1/rl/set_reward", self._set_reward, methods=["POST"])]
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_error})

    async def _http_error(self, request: Request, exc: Exception) -> JSONResponse:
        """Starlette's own errors (no such route, wrong method) as OpenAI-style JSON."""
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        where = f"{request.method} {request.url.path}"
        if status in (404, 405):
            message = (f"{'Unknown route' if status == 404 else 'Wrong method for'} {where}; "
                       f"this endpoint serves {_ROUTES}.")
        else:
            message = f"{where} failed: {getattr(exc, 'detail', exc)}."
        return _error(RequestError(status, message))

    async def _guarded(self, request: Request, action: Callable[[ChatHandler, Request], Any]) -> JSONResponse:
        """Authenticate, run ``action``, and turn every failure into an OpenAI-style error."""
        try:
            return JSONResponse(await action(self._handler_for(request), request))
        except RequestError as e:
            return _error(e)
        except Exception as e:  # noqa: BLE001 - any handler failure becomes a 500 for the client
            logger.exception("endpoint: %s %s failed in the chat handler", request.method, request.url.path)
            return _error(RequestError(500, f"The chat handler failed: {type(e).__name__}: {e}"))

    async def _chat(self, request: Request) -> JSONResponse:
        async def action(handler: ChatHandler, request: Request) -> dict[str, Any]:
            chat_request = await _refused(handler, parse_chat_request, _json_object(request))
            result = await call_handler(handler.create, chat_request)
            if isinstance(result, dict):
                return result
            if not callable(getattr(result, "model_dump", None)):
                raise TypeError(f"handler.create returned {type(result).__name__}; return a ChatCompletion.")
            return result.model_dump()

        return await self._guarded(request, action)

    async def _set_reward(self, request: Request) -> JSONResponse:
        async def action(handler: ChatHandler, request: Request) -> dict[str, Any]:
            reward, completion_id = await _refused(handler, _reward_body, _json_object(request))
            await call_handler(handler.set_reward, completion_id, reward)
            return {"ok": True, "completion_id": completion_id, "reward": reward}

        return await self._guarded(request, action)

    async def _models(self, request: Request) -> JSONResponse:
        async def action(handler: ChatHandler, request: Request) -> dict[str, Any]:
            model = {"id": MODEL_ID, "object": "model", "created": self._created, "owned_by": "areal_trainer"}
            return {"object": "list", "data": [model]}

        return await self._guarded(request, action)
