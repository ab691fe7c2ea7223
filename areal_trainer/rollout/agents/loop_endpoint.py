"""The HTTP endpoint served on the episodes' own event loop, as the trainer runs it.

An ``http`` agent's episodes and the requests they send meet on one event loop (``loop.py``): the episode's
session, which queues the request for the generation batcher, lives there. Served from a thread of its own
(:class:`~areal_trainer.rollout.agents.endpoint.EndpointServer`), every request crosses from the server's
thread to the episodes' loop and back, and each crossing waits for the other thread to take the GIL; with
an async agent on the same loop, its client's work competes with the server's thread too. Served as a task
of the episodes' loop, a request goes from the socket to its episode and back within one thread.

A loop that an agent blocks stops this server with the episodes, which changes nothing for them: the
requests it would take wait for that loop anyway. The server belongs to its loop: when the trainer abandons
a blocked loop, it leaves the server to it and the next rollout call starts another on the new loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import uvicorn

from .endpoint import GRACE_S, EndpointServer


class LoopEndpoint(EndpointServer):
    """:class:`EndpointServer` served by a task of the loop that first awaits :meth:`serving`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__(host, port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    async def serving(self) -> None:
        """Start serving on the running loop at the first call; every call returns once the server listens
        (raises ``RuntimeError`` when it could not start)."""
        if self._task is None:
            sock = self._bind()
            self._server, self._loop = uvicorn.Server(self._config()), asyncio.get_running_loop()
            self._task = self._loop.create_task(self._serve_here(self._server, sock),
                                                name=f"areal-endpoint-{self._port}")
        server, task = self._server, self._task
        while not server.started:
            if task.done():
                raise RuntimeError(f"EndpointServer: the server on port {self._port} did not start "
                                   f"({self._failure!r}).") from self._failure
            await asyncio.sleep(0.005)

    async def _serve_here(self, server: uvicorn.Server, sock) -> None:
        # uvicorn installs no signal handlers outside the main thread: the episodes' loop runs in its own.
        try:
            await server.serve(sockets=[sock])
        except BaseException as e:  # noqa: BLE001 - reported by serving()
            self._failure = e
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            sock.close()

    def start(self) -> None:
        raise RuntimeError("LoopEndpoint serves on an event loop: await serving() on it.")

    def stop(self, timeout: float = GRACE_S + 5) -> bool:
        """Stop serving and free the port, from any thread but the loop's; False when the loop did not let the
        server end within ``timeout`` seconds (it is blocked: the server is left to it)."""
        task, loop, server = self._task, self._loop, self._server
        self._task = self._loop = self._server = None
        if task is None or task.done() or loop.is_closed():
            return True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("LoopEndpoint.stop() cannot wait on its own loop; call it from another thread.")
        server.should_exit = True
        try:
            asyncio.run_coroutine_threadsafe(asyncio.wait([task]), loop).result(timeout)
        except concurrent.futures.TimeoutError:
            server.force_exit = True
            return False
        return True
