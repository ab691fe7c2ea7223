"""The trainer's side of the servers (``ServerEngine``) against servers served in this process (uvicorn threads
over real engines): answers in prompt order with the pushed version, the same tokens whichever server samples a
piece, a slow or gone server left for another within ``rollout.request_timeout``, and a binding that names an
unusable collective backend."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
import uvicorn

from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.rollout.servers.app import InferenceServer
from areal_trainer.rollout.servers.client import ServerEngine
from areal_trainer.rollout.servers.weights import DiskPusher

from ..servers import stuck_http

G = SimpleNamespace(n_samples=1, max_new_tokens=5, min_new_tokens=0, max_tokens=256, greedy=False, top_p=1.0,
                    top_k=100000000, temperature=1.0, stop_token_ids=[], stop=[])


class Served:
    """An InferenceServer on a free port, in a thread."""

    def __init__(self, seed: int):
        tok = build_tokenizer()
        self.engine = HFEngine(build_model("builtin:tiny", tok, seed=seed).eval(), tok, device=torch.device("cpu"),
                               stoppable=True)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(InferenceServer(self.engine, "hf").app, log_config=None,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def two(tmp_path):
    servers = [Served(seed=3), Served(seed=4)]  # different weights until the first push
    yield servers
    for s in servers:
        s.stop()


def _engine(addresses, tmp_path, **kw) -> ServerEngine:
    kw = {"request_timeout": 30, "retries": 2, **kw}
    engine = ServerEngine(addresses, pusher=DiskPusher(str(tmp_path / "w"), timeout=60), seed=1, **kw)
    # Servers in one process share torch's global sampler (a real server is a process of its own): one piece at a
    # time, so that each piece's seeded draws are its own.
    engine._pool = ThreadPoolExecutor(max_workers=1)
    return engine


def test_pieces_come_back_in_order_with_the_pushed_version_whichever_server_samples(two, tmp_path):
    tok = build_tokenizer()
    policy = build_model("builtin:tiny", tok, seed=0).eval()
    prompts = [[5, 6, 7]] * 4 + [[9, 10]] * 4
    both = _engine([s.address for s in two], tmp_path)
    both.update_weights(policy, 2)
    out = both.generate(prompts, G)
    assert len(out) == 8 and all(set(g.versions) == {2} for g in out)
    assert sum(s.engine.version == 2 for s in two) == 2
    # the same call on one server alone: the pieces' seeds, not the servers, decide the tokens
    one = _engine([two[1].address, two[0].address], tmp_path)
    one.pusher.current = both.pusher.current
    one._version = 2
    assert [g.output_ids for g in one.generate(prompts, G)] == [g.output_ids for g in out]
    assert one.telemetry()["rollout/server_requests"] == 2 and both.telemetry()["perf/weight_update_s"] > 0


def test_a_slow_server_is_left_for_another_after_the_request_timeout(two, tmp_path):
    with stuck_http() as slow:
        engine = _engine([slow, two[0].address], tmp_path, request_timeout=1.0)
        t0 = time.monotonic()
        out = engine.generate([[5, 6, 7]], G)  # the one piece goes to the first (idle) server: the slow one
        assert len(out) == 1 and time.monotonic() - t0 < 20
        stats = engine.telemetry()
        assert stats["rollout/server_retries"] == 1 and stats["rollout/servers_down"] == 1


def test_every_server_gone_stops_with_their_addresses(tmp_path):
    from areal_trainer.rollout.servers.weights import free_port

    gone = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    engine = _engine(gone, tmp_path, retries=1)
    with pytest.raises(UserError) as err:
        engine.generate([[5, 6]], G)
    assert "failed on 2 tries (rollout.request_retries=1)" in str(err.value) or "every inference server is down" in \
        str(err.value)
    with pytest.raises(UserError, match="every inference server is down"):
        engine.generate([[5, 6]], G)


def test_xccl_without_a_working_collective_backend_is_named(monkeypatch):
    from areal_trainer.components import load_config
    from areal_trainer.errors import ConfigError
    from areal_trainer.rollout.servers import group

    monkeypatch.setattr(group, "backend_problem", lambda backend: "this torch build has no gloo backend")
    with pytest.raises(ConfigError) as err:
        load_config("grpo", ["rollout.backend=hf:d1p1t1", "actor.weight_update_mode=xccl"])
    assert err.value.problems == ["actor.weight_update_mode=xccl: no collective backend works here (this torch build "
                                  "has no gloo backend); use actor.weight_update_mode=disk."]
