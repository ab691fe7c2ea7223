"""The endpoint served on the episodes' own loop (``LoopEndpoint``), as the trainer serves it: requests reach the
handler on that loop without a thread of the server's own, ``stop()`` from another thread frees the port, a loop
that an agent blocks keeps its server (``stop()`` says so instead of hanging), and a port that cannot be bound is
one error for the episode that starts the server."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from areal_trainer.rollout.agents.endpoint import LoopHandler
from areal_trainer.rollout.agents.loop import EpisodeLoop
from areal_trainer.rollout.agents.loop_endpoint import LoopEndpoint

TIMEOUT = 30


class Handler:
    """Answers every request with the name of the thread it ran on."""

    def __init__(self):
        self.rewards: list[float] = []

    async def create(self, request):
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "policy",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": threading.current_thread().name}}]}

    async def set_reward(self, completion_id, reward):
        self.rewards.append(reward)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _run(loop: EpisodeLoop, coro):
    return loop.run(coro, notice_s=TIMEOUT, abandon_s=TIMEOUT)


def test_requests_are_served_on_the_episodes_loop_and_stop_frees_the_port():
    loop, server, handler = EpisodeLoop(name="episodes"), LoopEndpoint(), Handler()

    async def open_key():
        await asyncio.gather(server.serving(), server.serving())  # two episodes at once start one server
        return server.open_episode(LoopHandler(handler, asyncio.get_running_loop()))

    key = _run(loop, open_key())
    try:
        assert not any(t.name.startswith("areal-endpoint") for t in threading.enumerate())
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(server.base_url + "/chat/completions", json=body, headers=headers, timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "episodes"
        r = httpx.post(server.base_url + "/rl/set_reward", json={"reward": 0.5}, headers=headers, timeout=TIMEOUT)
        assert r.status_code == 200 and handler.rewards == [0.5]
        port = server.port
        assert not _free(port)
    finally:
        assert server.stop() is True
        loop.close()
    assert _free(port) and server.stop() is True  # stopping twice is harmless


def test_stop_from_the_loop_itself_is_refused():
    loop, server = EpisodeLoop(), LoopEndpoint()
    _run(loop, server.serving())

    async def stop_here():
        with pytest.raises(RuntimeError, match="cannot wait on its own loop"):
            server.stop()

    try:
        _run(loop, stop_here())
    finally:
        loop.close()


def test_a_blocked_loop_keeps_its_server_and_stop_says_so():
    loop, server = EpisodeLoop(), LoopEndpoint()
    _run(loop, server.serving())
    release = threading.Event()
    loop.loop.call_soon_threadsafe(release.wait, TIMEOUT)  # an agent that blocks the loop
    t0 = time.monotonic()
    try:
        assert server.stop(timeout=0.5) is False
        assert time.monotonic() - t0 < 5
    finally:
        release.set()
        loop.close()


def test_a_port_that_cannot_be_bound_is_one_error_for_the_episode_that_starts_the_server():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        loop, server = EpisodeLoop(), LoopEndpoint(port=taken.getsockname()[1])
        try:
            with pytest.raises(RuntimeError, match=r"cannot listen on 127\.0\.0\.1:\d+.*choose another port"):
                _run(loop, server.serving())
        finally:
            loop.close()


def test_start_names_the_way_to_serve():
    with pytest.raises(RuntimeError, match=r"await serving\(\)"):
        LoopEndpoint().start()
