"""RemoteReward against a local HTTP server: batches in order, retries, a bound on requests in flight,
and a clear stop (never silent zeros) when the service does not answer properly."""

import asyncio
import socket
import time

import pytest

from areal_trainer.errors import UserError
from areal_trainer.reward.functions import RewardSample
from areal_trainer.reward.remote import RemoteReward, url_problems
from areal_trainer.reward.service import RewardService
from tests.servers import serving


@pytest.fixture
def server(monkeypatch):
    with serving(monkeypatch) as s:
        yield s


SAMPLES = [RewardSample("p", "x" * k, answer=k, fields={"id": k}) for k in range(7)]


def score(remote, samples=SAMPLES):
    try:
        return asyncio.run(remote.score(samples))
    finally:
        remote.close()


def test_batches_are_scored_in_order(server):
    server.delay = lambda body: 0.3 if body["samples"][0]["answer"] == 0 else 0.0  # the first batch answers last
    rewards = score(RemoteReward(server.url, batch_size=3))
    assert rewards == [None, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert sorted(len(r["samples"]) for r in server.requests) == [1, 3, 3]  # sent concurrently: any order
    first = next(r for r in server.requests if r["samples"][0]["answer"] == 0)
    assert first["samples"][0] == {"prompt": "p", "completion": "", "answer": 0, "fields": {"id": 0}}


def test_a_failed_request_is_retried(server):
    server.reply = [(503, "overloaded")]
    assert score(RemoteReward(server.url, backoff=0.01)) == [None, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert len(server.requests) == 2


@pytest.mark.parametrize("reply, shown", [
    ((500, "Traceback: boom"), r"HTTP 500, body 'Traceback: boom'"),
    ((200, "<html>not json</html>"), r"HTTP 200, body is not JSON: '<html>not json</html>'"),
    ((200, '{"rewards": [1.0]}'), r"HTTP 200, 1 rewards for 7 samples: '\{\"rewards\": \[1.0\]\}'"),
    ((200, '{"scores": []}'), r"HTTP 200, body has no \"rewards\" list"),
])
def test_bad_responses_stop_the_run_after_the_retries(server, reply, shown):
    server.reply = [reply] * 3
    with pytest.raises(UserError, match=rf"^reward service remote at {server.url} failed a batch of 7 samples after 3 "
                                        rf"attempts: {shown}"):
        score(RemoteReward(server.url, retries=2, backoff=0.01))
    assert len(server.requests) == 3


def test_a_client_error_is_not_retried(server):
    server.reply = [(400, '{"detail": "missing field"}')]
    with pytest.raises(UserError, match=r"\(not retried\): HTTP 400, body '\{\"detail\": \"missing field\"\}'"):
        score(RemoteReward(server.url, retries=3, backoff=0.01))
    assert len(server.requests) == 1


def test_a_refused_connection_stops_the_run_naming_the_url(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/score"
    t0 = time.monotonic()
    with pytest.raises(UserError, match=rf"^reward service judge at {url} failed .* after 3 attempts: no response "
                                        r"\(\[Errno 111\] Connection refused\)"):
        score(RemoteReward(url, retries=2, backoff=0.05, name="judge"))
    assert time.monotonic() - t0 >= 0.05 + 0.1  # backoff doubles between attempts


def test_at_most_max_concurrent_requests_are_in_flight(server):
    def held(body) -> float:  # each request waits until three were in flight at once (20 s at most)
        deadline = time.monotonic() + 20
        while server.max_in_flight < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        return 0.0

    server.delay = held
    rewards = score(RemoteReward(server.url, batch_size=1, max_concurrent=3))
    assert rewards[1:] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert len(server.requests) == 7 and server.max_in_flight == 3


def test_nan_from_the_service_is_counted_as_nonfinite(server):
    server.reply = [(200, '{"rewards": [NaN, 1.0]}')]
    with RewardService([RemoteReward(server.url, name="judge")], max_error_fraction=1.0) as service:
        scores = service.score(SAMPLES[:2])
    assert scores.rewards == [0.0, 1.0] and scores.nonfinite == [1, 0]


def test_url_problems():
    assert url_problems("http://localhost:8000/score", "reward.remote.url") == []
    assert url_problems("https://judge.internal/v1", "k") == []
    for bad, why in [("localhost:8000", "must start with http:// or https://"), ("", "give the scoring service's URL"),
                     ("http:///score", "names no host"), ("http://host:port/x", "invalid port"),
                     ("http://host/a b", "whitespace")]:
        problems = url_problems(bad, "reward.remote.url")
        assert len(problems) == 1 and problems[0].startswith("reward.remote.url: ") and why in problems[0], bad
    with pytest.raises(ValueError, match="must start with http"):
        RemoteReward("ftp://x/score")
