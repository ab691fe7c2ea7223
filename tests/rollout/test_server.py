"""The OpenAI-compatible endpoint, driven by the real ``openai`` client against a fake handler."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import httpx
import openai
import pytest

from areal_trainer.rollout.agents.endpoint import EndpointServer, LoopHandler
from areal_trainer.rollout.agents.openai_types import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageToolCall,
    Choice,
    CompletionUsage,
    Function,
)
from areal_trainer.rollout.agents.requests import ChatRequest, RequestError

TIMEOUT = 10  # seconds; generous for shared CPUs, short enough that a hang fails the test


class EchoHandler:
    """Echoes the last user message; calls the first tool (``{"q": <message>}``) when tools are
    given; one choice per ``n``. "missing" -> RequestError(404), "crash" -> ZeroDivisionError."""

    def __init__(self):
        self.requests: list[ChatRequest] = []
        self.rewards: list[tuple[str | None, float]] = []
        self.threads: set[str] = set()

    async def create(self, request: ChatRequest) -> ChatCompletion:
        self.requests.append(request)
        self.threads.add(threading.current_thread().name)
        text = request.messages[-1].content
        if text == "missing":
            raise RequestError(404, "No such thing.")
        if text == "crash":
            return 1 / 0
        choices = [self._choice(i, text, request) for i in range(request.n)]
        return ChatCompletion(model=request.model or "policy", choices=choices,
                              usage=CompletionUsage(prompt_tokens=len(request.messages), completion_tokens=1))

    def _choice(self, i: int, text: str, request: ChatRequest) -> Choice:
        if request.tools:
            name = request.tools[0]["function"]["name"]
            call = ChatCompletionMessageToolCall(id=f"call_{i}", function=Function(name=name,
                                                                                   arguments=json.dumps({"q": text})))
            return Choice(index=i, message=ChatCompletionMessage(tool_calls=[call]), finish_reason="tool_calls")
        return Choice(index=i, message=ChatCompletionMessage(content=f"{text} #{i}"), finish_reason="stop")

    async def set_reward(self, completion_id: str | None, reward: float) -> None:
        if completion_id == "unknown":
            raise RequestError(404, "No completion 'unknown' in this episode.", param="completion_id")
        self.rewards.append((completion_id, reward))


@pytest.fixture(scope="module")
def server():
    with EndpointServer() as srv:
        yield srv


@pytest.fixture
def episode(server):
    handler = EchoHandler()
    key = server.open_episode(handler)
    yield handler, key
    server.close_episode(key)


def client(server, key, cls=openai.OpenAI):
    return cls(base_url=server.base_url, api_key=key, max_retries=0, timeout=TIMEOUT)


USER = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def test_chat_with_the_sync_client(server, episode):
    handler, key = episode
    resp = client(server, key).chat.completions.create(model="anything", messages=USER, max_tokens=7,
                                                       temperature=0.5, stop=["\n"])
    assert isinstance(resp, openai.types.chat.ChatCompletion)
    assert resp.choices[0].message.content == "hello #0" and resp.choices[0].finish_reason == "stop"
    assert resp.model == "anything" and resp.usage.total_tokens == 2
    req = handler.requests[0]
    assert (req.max_tokens, req.temperature, req.stop, req.n) == (7, 0.5, ["\n"], 1)
    # Coroutine handlers run on the server's own loop thread.
    assert handler.threads == {f"areal-endpoint-{server.port}"}


def test_chat_with_the_async_client(server, episode):
    _, key = episode

    async def main():
        async with client(server, key, openai.AsyncOpenAI) as c:
            return await c.chat.completions.create(model="m", messages=USER)

    assert asyncio.run(main()).choices[0].message.content == "hello #0"


def test_tool_calls_reach_the_client(server, episode):
    handler, key = episode
    resp = client(server, key).chat.completions.create(model="m", messages=USER, tools=TOOLS)
    call = resp.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("search", {"q": "hello"})
    assert resp.choices[0].finish_reason == "tool_calls" and resp.choices[0].message.content is None
    assert handler.requests[0].tools == TOOLS and handler.requests[0].tool_choice == "auto"


def test_n_gives_several_choices(server, episode):
    _, key = episode
    resp = client(server, key).chat.completions.create(model="m", messages=USER, n=3)
    assert [(c.index, c.message.content) for c in resp.choices] == [(0, "hello #0"), (1, "hello #1"), (2, "hello #2")]


def test_models_list(server, episode):
    _, key = episode
    assert [m.id for m in client(server, key).models.list()] == ["policy"]


def test_wrong_missing_and_closed_keys_are_401(server, episode):
    _, key = episode
    with pytest.raises(openai.AuthenticationError, match="not the key of an open episode"):
        client(server, "sk-wrong").chat.completions.create(model="m", messages=USER)
    r = httpx.post(server.base_url + "/chat/completions", json={"messages": USER}, timeout=TIMEOUT)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    other = server.open_episode(EchoHandler())
    server.close_episode(other)
    with pytest.raises(openai.AuthenticationError):
        client(server, other).models.list()
    server.close_episode(other)  # closing twice is harmless


def test_malformed_requests_are_400(server, episode):
    _, key = episode
    with pytest.raises(openai.BadRequestError, match="messages\\[0\\].role"):
        client(server, key).chat.completions.create(model="m", messages=[{"role": "robot", "content": "x"}])
    headers = {"Authorization": f"Bearer {key}"}
    for body, words in ((b"{not json", "not valid JSON"), (b"[1]", "must be a JSON object"),
                        (json.dumps({"messages": USER, "stream": True}).encode(), "streaming is not supported")):
        r = httpx.post(server.base_url + "/chat/completions", content=body, headers=headers, timeout=TIMEOUT)
        assert r.status_code == 400 and words in r.json()["error"]["message"]


def test_handler_request_error_keeps_its_status(server, episode):
    _, key = episode
    with pytest.raises(openai.NotFoundError, match="No such thing"):
        client(server, key).chat.completions.create(model="m", messages=[{"role": "user", "content": "missing"}])


def test_handler_crash_is_a_json_500(server, episode):
    _, key = episode
    r = httpx.post(server.base_url + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "m", "messages": [{"role": "user", "content": "crash"}]}, timeout=TIMEOUT)
    assert r.status_code == 500
    assert r.json()["error"]["message"] == "The chat handler failed: ZeroDivisionError: division by zero"
    with pytest.raises(openai.InternalServerError):
        client(server, key).chat.completions.create(model="m", messages=[{"role": "user", "content": "crash"}])


def test_unknown_route_and_wrong_method_are_json(server):
    r = httpx.get(server.base_url + "/embeddings", timeout=TIMEOUT)
    assert r.status_code == 404 and "Unknown route GET /v1/embeddings" in r.json()["error"]["message"]
    r = httpx.get(server.base_url + "/chat/completions", timeout=TIMEOUT)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


def test_set_reward(server, episode):
    handler, key = episode
    url, headers = server.base_url.removesuffix("/v1") + "/rl/set_reward", {"Authorization": f"Bearer {key}"}
    r = httpx.post(url, json={"completion_id": "chatcmpl-1", "reward": 1}, headers=headers, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["ok"] is True
    assert httpx.post(url, json={"reward": -0.5}, headers=headers, timeout=TIMEOUT).status_code == 200
    assert handler.rewards == [("chatcmpl-1", 1.0), (None, -0.5)]
    for body, status, param in (({"reward": "high"}, 400, "reward"), ({"reward": True}, 400, "reward"),
                                ({"completion_id": 5, "reward": 1}, 400, "completion_id"),
                                ({"completion_id": "unknown", "reward": 1}, 404, "completion_id")):
        r = httpx.post(url, json=body, headers=headers, timeout=TIMEOUT)
        assert r.status_code == status and r.json()["error"]["param"] == param
    r = httpx.post(url, content=b"NaN", headers=headers, timeout=TIMEOUT)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    assert httpx.post(url, json={"reward": 1}, timeout=TIMEOUT).status_code == 401
    assert len(handler.rewards) == 2


def test_requests_are_served_concurrently(server):
    """Each request waits until all have arrived: only a server that runs them concurrently answers."""

    class Barrier(EchoHandler):
        def __init__(self, parties):
            super().__init__()
            self.arrived, self.parties, self.all_in = 0, parties, asyncio.Event()

        async def create(self, request):
            self.arrived += 1
            if self.arrived == self.parties:
                self.all_in.set()
            await asyncio.wait_for(self.all_in.wait(), TIMEOUT / 2)
            return await super().create(request)

    key = server.open_episode(Barrier(4))

    async def main():
        async with client(server, key, openai.AsyncOpenAI) as c:
            return await asyncio.gather(*(c.chat.completions.create(model="m", messages=USER) for _ in range(4)))

    assert len(asyncio.run(main())) == 4
    server.close_episode(key)


def test_sync_handler_and_loop_handler(server):
    """A plain create() runs in a worker thread; LoopHandler runs coroutines on another thread's loop."""

    class SyncHandler(EchoHandler):
        def create(self, request):
            self.threads.add(threading.current_thread().name)
            return asyncio.run(super().create(request))

    sync = SyncHandler()
    key = server.open_episode(sync)
    assert client(server, key).chat.completions.create(model="m", messages=USER).choices[0].message.content
    assert f"areal-endpoint-{server.port}" not in sync.threads

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="engine-loop", daemon=True)
    thread.start()
    try:
        inner = EchoHandler()
        key = server.open_episode(LoopHandler(inner, loop))
        assert client(server, key).chat.completions.create(model="m", messages=USER).choices[0].message.content
        assert inner.threads == {"engine-loop"}
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        loop.close()


def test_open_episode_checks_the_handler(server):
    with pytest.raises(TypeError, match="has no method set_reward"):
        server.open_episode(type("OnlyCreate", (), {"create": lambda self, r: None})())


def test_binds_loopback_only(server):
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT):
        pass
    # 127.0.0.2 is loopback too, so only a socket bound to 127.0.0.1 itself refuses it (0.0.0.0 would not).
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", server.port), timeout=TIMEOUT).close()


def test_stop_frees_the_port():
    srv = EndpointServer()
    with pytest.raises(RuntimeError, match="once start"):
        srv.base_url  # noqa: B018 - the property raises before start()
    srv.start()
    with pytest.raises(RuntimeError, match="already running"):
        srv.start()
    port, key = srv.port, srv.open_episode(EchoHandler())
    c = client(srv, key)  # keeps its connection alive across requests
    assert c.chat.completions.create(model="m", messages=USER).choices
    srv.stop()
    srv.stop()  # twice is harmless
    with pytest.raises(openai.APIConnectionError):
        c.chat.completions.create(model="m", messages=USER)
    with EndpointServer(port=port) as again:  # the same port binds again at once
        assert again.port == port
        key = again.open_episode(EchoHandler())
        assert client(again, key).chat.completions.create(model="m", messages=USER).choices
    assert not any(t.name == f"areal-endpoint-{port}" for t in threading.enumerate())


def test_bind_failure_names_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
            EndpointServer(port=port).start()
