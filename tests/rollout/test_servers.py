"""The inference servers' pieces without a process: the request split and seeds, the wire format, the backend
grammar, the server's routes (Starlette's test client over a real engine) and the weight group (two members in
one process)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from areal_trainer.config.servers import address_problems, parse_backend
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.rollout.servers.app import InferenceServer
from areal_trainer.rollout.servers.client import piece_seed, split_runs
from areal_trainer.rollout.servers.group import TensorMeta, WeightGroup, metas_of, plan_buckets
from areal_trainer.rollout.servers.protocol import gconfig_to_json, generation_from_json, generation_to_json
from areal_trainer.rollout.servers.weights import DiskPusher, free_port
from areal_trainer.rollout.types import Generation

from ..servers import stuck_http

G = SimpleNamespace(n_samples=1, max_new_tokens=6, min_new_tokens=0, max_tokens=256, greedy=False, top_p=1.0,
                    top_k=100000000, temperature=1.0, stop_token_ids=[], stop=[])


def test_split_keeps_a_prompts_samples_together():
    a, b, c = [1], [2], [3]
    prompts = [a, a, a, a, b, b, c, c]
    assert split_runs(prompts, 2) == [(0, 4), (4, 8)]
    assert split_runs(prompts, 3) == [(0, 4), (4, 6), (6, 8)]
    assert split_runs(prompts, 10) == [(0, 4), (4, 6), (6, 8)]  # no more pieces than distinct prompts
    assert split_runs([a] * 5, 4) == [(0, 5)]
    assert split_runs(prompts, 1) == [(0, 8)]
    # A long last run: the cut nearest a target would take its end and leave the later pieces nothing.
    assert split_runs([a, b, a, b, a, a, a, a, a], 5) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 9)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), min_size=1, max_size=12), st.integers(1, 6))
def test_split_covers_every_row_in_order_and_never_cuts_a_run(runs, parts):
    prompts = [[tok] for tok, n in runs for _ in range(n)]
    cuts = split_runs(prompts, parts)
    distinct = sum(1 for i in range(len(prompts)) if i == 0 or prompts[i] != prompts[i - 1])
    assert cuts[0][0] == 0 and cuts[-1][1] == len(prompts) and len(cuts) == min(parts, distinct)
    assert all(lo < hi for lo, hi in cuts) and all(x[1] == y[0] for x, y in zip(cuts, cuts[1:]))
    assert all(prompts[lo] != prompts[lo - 1] for lo, _ in cuts[1:])


def test_piece_seeds_are_deterministic_and_distinct():
    seeds = {piece_seed(1, v, c, k) for v in range(4) for c in range(4) for k in range(4)}
    assert len(seeds) == 64 and all(0 <= s < 2 ** 63 for s in seeds)
    assert piece_seed(1, 2, 3, 0) == piece_seed(1, 2, 3, 0) != piece_seed(2, 2, 3, 0)


def test_the_wire_format_round_trips_and_names_what_is_malformed():
    gen = Generation([5, 6, 2], [-0.5, -1.25, -0.125], False, [3, 3, 4])
    assert generation_from_json(generation_to_json(gen)) == gen
    with pytest.raises(ValueError, match="3 tokens, 2 log-probs and 3 versions"):
        generation_from_json({"output_ids": [1, 2, 3], "logprobs": [0.0, 0.0], "versions": [0, 0, 0],
                              "truncated": False})
    with pytest.raises(ValueError, match="lacks 'versions'"):
        generation_from_json({"output_ids": [1], "logprobs": [0.0], "truncated": False})
    assert gconfig_to_json(G)["max_new_tokens"] == 6 and set(gconfig_to_json(G)) >= {"temperature", "stop"}


@pytest.mark.parametrize("value, message", [
    ("vllm:d2p1t1", None), ("hf:d3p1t1", None), ("vllm.d1p1t4", None),
    ("vllm:d2p2t1", "pipeline parallelism (p=2) is not supported"),
    ("hf:d1p1t2", "the hf engine has no tensor parallelism"),
    ("sglang:d1p1t1", "unknown engine 'sglang'"),
    ("vllm:d0p1t1", "must be >= 1"),
    ("vllm:2", "write hf or vllm"),
])
def test_backend_grammar(value, message):
    backend, problems = parse_backend(value)
    if message is None:
        assert backend is not None and not problems
    else:
        assert backend is None and any(message in p for p in problems), problems


def test_addresses_are_host_and_port():
    assert address_problems("rollout.server_addrs", ["127.0.0.1:8001", "gpu-3.cluster:9000", "[::1]:80"]) == []
    bad = address_problems("rollout.server_addrs", ["localhost", "127.0.0.1:99999", "a:1", "a:1"])
    assert any("'localhost' is not host:port" in p for p in bad)
    assert any("'127.0.0.1:99999' is not host:port" in p for p in bad)
    assert any("a:1 is listed twice" in p for p in bad)


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_model("builtin:tiny", tok, seed=0).eval()


def _server(tiny, **kw):
    tok, model = tiny
    twin = build_model("builtin:tiny", tok, seed=5).eval()  # other weights until a push
    engine = HFEngine(twin, tok, device=torch.device("cpu"), stoppable=True, **kw)
    return InferenceServer(engine, "hf"), engine


def test_seeded_generation_depends_on_the_seed_and_prompts_only(tiny):
    server, engine = _server(tiny)
    client = TestClient(server.app)
    body = {"prompts": [[5, 6, 7], [5, 6, 7], [9, 10]], "gconfig": gconfig_to_json(G), "seed": 11}
    first = client.post("/generate", json=body).json()
    client.post("/generate", json={**body, "seed": 99})  # the sampler moved on in between
    assert client.post("/generate", json=body).json() == first
    torch.manual_seed(11)
    direct = engine.generate(body["prompts"], G)  # what the engine gives for that seed, in process
    assert [generation_from_json(g) for g in first["generations"]] == direct
    assert first["version"] == 0 and all(v == 0 for g in first["generations"] for v in g["versions"])


def test_bad_requests_are_400_with_the_reason(tiny):
    client = TestClient(_server(tiny)[0].app)
    r = client.post("/generate", json={"prompts": [[]], "gconfig": gconfig_to_json(G)})
    assert r.status_code == 400 and "non-empty lists of token ids" in r.json()["error"]["message"]
    r = client.post("/generate", json={"prompts": [[1]], "gconfig": {"bogus": 1}})
    assert r.status_code == 400 and "unknown sampling settings ['bogus']" in r.json()["error"]["message"]
    r = client.post("/update_weights/disk", json={"path": "/nonexistent", "version": 1})
    assert r.status_code == 400 and "'/nonexistent'" in r.json()["error"]["message"]
    r = client.post("/update_weights/group", json={"version": 1})
    assert r.status_code == 400 and "group/init first" in r.json()["error"]["message"]


def test_a_disk_update_makes_the_server_sample_like_the_pushed_weights(tiny, tmp_path):
    tok, model = tiny
    server, engine = _server(tiny)
    client = TestClient(server.app)
    pusher = DiskPusher(str(tmp_path), timeout=60, bucket_bytes=200_000)  # several files
    path = pusher.write(model, "v3")
    assert len(list((tmp_path / "v3").glob("*.safetensors"))) > 1 and not (tmp_path / "v3.partial").exists()
    r = client.post("/update_weights/disk", json={"path": path, "version": 3})
    assert r.status_code == 200, r.text
    for name, p in model.named_parameters():
        assert torch.equal(dict(engine.model.named_parameters())[name], p)
    out = client.post("/generate", json={"prompts": [[5, 6]], "gconfig": gconfig_to_json(G), "seed": 1}).json()
    assert out["version"] == 3 and set(out["generations"][0]["versions"]) == {3}


def test_bucket_plan_keeps_one_dtype_and_the_size():
    metas = [TensorMeta("a", (10,), "float32"), TensorMeta("b", (10,), "float32"), TensorMeta("c", (100,), "float32"),
             TensorMeta("d", (3,), "int64"), TensorMeta("e", (1,), "float32")]
    assert plan_buckets(metas, bucket_bytes=100) == [2, 1, 1, 1]
    assert plan_buckets(metas, bucket_bytes=10 ** 6) == [3, 1, 1]


def test_a_weight_group_broadcasts_buckets_to_a_receiver():
    port = free_port()
    sent = {"x": torch.randn(3, 4), "y": torch.arange(5, dtype=torch.float32), "z": torch.randn(7)}
    metas = metas_of(sent.items())
    buckets = plan_buckets(metas, bucket_bytes=64)
    got: dict = {}

    def receiver():
        g = WeightGroup(host="127.0.0.1", port=port, rank=1, world_size=2, backend="gloo", timeout=30, group="t")
        got.update({n: t.clone() for n, t in g.receive(metas, buckets)})

    t = threading.Thread(target=receiver)
    t.start()
    sender = WeightGroup(host="127.0.0.1", port=port, rank=0, world_size=2, backend="gloo", timeout=30, group="t")
    sender.send(sent.values(), buckets)
    t.join(30)
    assert set(got) == set(sent) and all(torch.equal(got[k], v) for k, v in sent.items())
    assert len(buckets) > 1


def test_a_stuck_update_fails_in_its_time_naming_the_server_the_mode_and_the_stage(tiny, tmp_path):
    """A server that takes the request and never answers: the update stops after actor.weight_update_timeout."""
    import time

    pusher = DiskPusher(str(tmp_path), timeout=1.5)
    t0 = time.monotonic()
    with stuck_http() as address, pytest.raises(Exception) as err:
        pusher.push(tiny[1], 7, [address])
    assert time.monotonic() - t0 < 15
    msg = str(err.value)
    assert msg.startswith(f"weight update (actor.weight_update_mode=disk) to inference server {address} failed after "
                          "writing v7 (")
    assert "no answer within actor.weight_update_timeout=1.5 s" in msg


def test_a_gone_server_is_reported_not_raised(tiny, tmp_path):
    """A refused connection during an update means the server is gone: the pusher says which, the caller marks it
    down (and restarts it) while the others keep the weights."""
    pusher = DiskPusher(str(tmp_path), timeout=10)
    gone = f"127.0.0.1:{free_port()}"
    assert pusher.push(tiny[1], 1, [gone]) == [gone]


def test_a_server_gone_mid_update_ends_the_others_wait_at_once(monkeypatch):
    """A weight group of the trainer and two servers; the first is gone when the weights are broadcast: the update
    reports it gone within seconds, and the other server's receive fails at once instead of waiting out the
    group's timeout (the update used to wait that long for it, with the run stalled)."""
    import time

    from areal_trainer.rollout.servers.weights import GroupPusher, Unreachable

    port, timeout = free_port(), 60
    weights = {"x": torch.randn(64, 64), "y": torch.randn(300)}
    metas = metas_of(weights.items())
    members: dict = {}
    ended: dict = {}

    def join(rank: int) -> None:
        members[rank] = WeightGroup(host="127.0.0.1", port=port, rank=rank, world_size=3, backend="gloo",
                                    timeout=timeout, group="t")

    joins = [threading.Thread(target=join, args=(r,)) for r in (1, 2)]
    for t in joins:
        t.start()
    pusher = GroupPusher(backend="gloo", timeout=timeout)
    pusher.group = WeightGroup(host="127.0.0.1", port=port, rank=0, world_size=3, backend="gloo", timeout=timeout,
                               group="t")
    for t in joins:
        t.join(30)
    pusher.members = ("gone:1", "alive:2")
    members.pop(1).close()  # the first server's process is gone: its connections are closed

    def post_all(addresses, route, body, deadline):  # the servers' side of POST /update_weights/group
        if addresses == ["gone:1"]:
            return ["gone:1"]  # connection refused
        t0 = time.monotonic()
        try:
            for _ in members[2].receive(metas, body["buckets"]):
                pass
        except Exception as e:  # noqa: BLE001 - the server answers 500
            ended["alive"] = time.monotonic() - t0
            raise RuntimeError(f"HTTP 500: {e}") from None
        return []

    monkeypatch.setattr(pusher, "_post_all", post_all)
    t0 = time.monotonic()
    with pytest.raises(Unreachable) as err:
        pusher.push(weights, 1, ["gone:1", "alive:2"])
    assert err.value.addresses == ["gone:1"]
    assert time.monotonic() - t0 < 15
    assert ended["alive"] < 15
    assert pusher.group is None  # formed again, without the gone server, at the retry
