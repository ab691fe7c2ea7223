"""Inference servers through the real command line (``rollout.backend=hf:d<N>p1t1``, the server processes of
``python -m areal_trainer.rollout.servers``): GRPO with weights pushed by disk and by a gloo group, the servers'
log-probs against the trainer's recomputed ones, a server killed mid-run, the lagged mode reproducible, the
asynchronous mode's staleness bound, no server left after the run ends, is interrupted or is killed, and every
bad setting named before any model loads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from .helpers import cli, cli_env, comparable, ended, popen, processes_left, step_records, wait_until

pytestmark = pytest.mark.e2e
TINY = ["--config-name", "grpo", "+scale=tiny", "evaluator.freq_steps=null", "saver.freq_steps=null",
        "stats_logger.progress_bar=false"]


def _marker(tmp_path) -> dict:
    return {"AREAL_TEST_SERVERS": str(tmp_path)}  # inherited by the servers: finds them in /proc


def _pids(run_dir) -> list[int]:
    """The server processes of a run, asked by their port files."""
    pids = []
    for name in sorted(os.listdir(run_dir / "servers")):
        if name.endswith(".port"):
            port = (run_dir / "servers" / name).read_text().strip()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                pids.append(json.load(r)["pid"])
    return pids


@pytest.mark.parametrize("mode", ["disk", "xccl"])
def test_grpo_on_two_servers_samples_what_the_trainer_computes(tmp_path, mode):
    run = tmp_path / "run"
    cli([*TINY, "rollout.backend=hf:d2p1t1", f"actor.weight_update_mode={mode}", "actor.recompute_logprob=true",
         "total_train_steps=3", f"hydra.run.dir={run}"], cwd=tmp_path, env=_marker(tmp_path))
    records = step_records(run)
    assert sorted(records) == [1, 2, 3]
    for r in records.values():
        assert r["mismatch/abs_logp_diff/max"] < 1e-3, r["mismatch/abs_logp_diff/max"]  # fp32, same weights
        assert r["actor/staleness/max"] == 0  # every token sampled by the version trained
        assert r["rollout/server_requests"] >= 2 and r["rollout/server_retries"] == 0
        assert r["perf/weight_update_s"] > 0 and r["perf/gen_tokens_per_s"] > 0 and r["perf/train_tokens_per_s"] > 0
    assert not processes_left(str(tmp_path))  # the run stopped its servers
    assert (run / "servers" / "server-1.log").exists()


@pytest.mark.parametrize("mode", ["disk", "xccl"])
def test_a_killed_server_is_retried_on_the_other_and_restarted(tmp_path, mode):
    """The run goes on on the other server, starts the killed one again, and (disk: at once; xccl: at the next
    update, in a group formed again) gives it the current weights before it serves."""
    run = tmp_path / "run"
    kill_one_and_recover(long_run(tmp_path, run, "rollout.backend=hf:d2p1t1", f"actor.weight_update_mode={mode}"),
                         run, tmp_path)


def long_run(tmp_path, run, *overrides: str):
    """A run that goes on until it is stopped, its servers marked as the test's (a ``subprocess.Popen`` or the
    forked run that behaves as one, :func:`.helpers.popen`)."""
    return popen([*TINY, *overrides, "total_train_steps=100000", "total_train_epochs=10000", f"hydra.run.dir={run}"],
                 tmp_path, _marker(tmp_path))


def kill_one_and_recover(proc, run, tmp_path, wait: float = 300) -> None:
    """SIGKILL the first of two servers after the first step; the run notices (a generate request retried on the
    other server, or the weight update finding it gone), starts it again, and steps on both; Ctrl-C then ends the
    run with no server left."""
    try:
        wait_until(lambda: (run / "metrics.jsonl").exists() and len(_steps(run)) >= 1, proc, "the first step", wait)
        os.kill(_pids(run)[0], signal.SIGKILL)
        wait_until(lambda: _total(run, "rollout/server_retries") + _total(run, "rollout/server_failures") >= 1, proc,
                   "the gone server noticed", wait)
        wait_until(lambda: _total(run, "rollout/server_restarts") >= 1, proc, "the server's restart", wait)
        n = len(_steps(run))
        wait_until(lambda: len(_steps(run)) >= n + 2, proc, "steps on both servers again", wait)
        assert len(_pids(run)) == 2
        assert _steps(run)[-1]["rollout/servers_down"] == 0
        proc.send_signal(signal.SIGINT)
        ended(proc, "Ctrl-C")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not processes_left(str(tmp_path), within=30)


def _total(run, key: str) -> float:
    return sum(r.get(key, 0.0) for r in _steps(run))


def _steps(run) -> list:
    """The training steps written so far, while the run goes on."""
    return list(step_records(run).values())


def test_the_lagged_mode_is_reproducible_on_servers(tmp_path):
    args = [*TINY, "rollout.backend=hf:d1p1t1", "rollout.max_head_offpolicyness=2", "rollout.offpolicy_mode=lagged",
            "rollout.lagged_switch_prob=0.5", "total_train_steps=4"]
    for name in ("a", "b"):
        cli([*args, f"hydra.run.dir={tmp_path / name}"], cwd=tmp_path)
    a, b = step_records(tmp_path / "a"), step_records(tmp_path / "b")
    assert sorted(a) == [1, 2, 3, 4]
    assert {k: comparable(v) for k, v in a.items()} == {k: comparable(v) for k, v in b.items()}
    assert max(r["actor/staleness/max"] for r in a.values()) >= 1  # it did sample with older weights


def test_asynchronous_training_on_a_server_keeps_the_staleness_bound(tmp_path):
    run = tmp_path / "run"
    cli([*TINY, "rollout.backend=hf:d1p1t1", "rollout.max_head_offpolicyness=1", "total_train_steps=5",
         f"hydra.run.dir={run}"], cwd=tmp_path)
    records = step_records(run)
    assert sorted(records) == [1, 2, 3, 4, 5]
    assert all(r["actor/staleness/max"] <= 1 for r in records.values())
    assert all("time/generation" in r for r in records.values())


@pytest.mark.parametrize("how", ["SIGKILL", "Ctrl-C"])
def test_no_server_outlives_its_trainer(tmp_path, how):
    run = tmp_path / "run"
    stop_after_first_step(long_run(tmp_path, run, "rollout.backend=hf:d2p1t1"), run, tmp_path, how, servers=2)


def stop_after_first_step(proc, run, tmp_path, how: str = "Ctrl-C", servers: int | None = None,
                          wait: float = 300) -> None:
    """Once the run has stepped (and has ``servers`` servers), SIGKILL or Ctrl-C it: no server may be left."""
    try:
        wait_until(lambda: (run / "metrics.jsonl").exists() and len(_steps(run)) >= 1, proc, "the first step", wait)
        if servers is not None:
            assert len(_pids(run)) == servers
        proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGINT)
        ended(proc, how)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not processes_left(str(tmp_path), within=30), f"servers left after {how}"


def test_an_unreachable_server_is_named_before_training(tmp_path):
    from areal_trainer.rollout.servers.weights import free_port

    address = f"127.0.0.1:{free_port()}"
    out = cli([*TINY, f"rollout.server_addrs=[{address}]", "rollout.setup_timeout=2", "total_train_steps=2"],
              cwd=tmp_path, check=False)
    assert out.returncode != 0
    assert f"inference server(s) {address} did not answer GET /health within 2 s" in out.stderr
    assert "Traceback" not in out.stderr
    assert not list(tmp_path.rglob("metrics.jsonl")) or not any(
        "time/step" in line for p in tmp_path.rglob("metrics.jsonl") for line in open(p))


@pytest.mark.parametrize("overrides, message", [
    (["rollout.server_addrs=[localhost]"], "rollout.server_addrs: the entry 'localhost' is not host:port"),
    (["rollout.backend=vllm:d1p2t1"], "pipeline parallelism (p=2) is not supported"),
    (["rollout.backend=hf:d64p1t1"], "needs 64 CPU core(s) for its servers"),
    (["rollout.backend=hf:d1p1t1", "rollout.server_addrs=[127.0.0.1:8001]"], "set one"),
    (["rollout.backend=hf:d1p1t1", "actor.weight_update_mode=nccl"], "actor.weight_update_mode: got 'nccl'"),
    (["rollout.backend=hf:d1p1t1", "actor.weight_update_dir=/proc/areal"], "actor.weight_update_dir"),
])
def test_bad_server_settings_are_named_before_any_model_loads(tmp_path, overrides, message):
    out = cli([*TINY, *overrides], cwd=tmp_path, check=False)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "outputs").exists()  # nothing was started


def test_a_server_started_by_hand_serves_a_run(tmp_path):
    """rollout.server_addrs: the run pushes its weights to a server it did not start, and leaves it running."""
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, "-m", "areal_trainer.rollout.servers", "--model", "builtin:tiny",
                               "--port-file", str(port_file)], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(port_file.exists, server, "the server to listen")
        run = tmp_path / "run"
        cli([*TINY, f"rollout.server_addrs=[127.0.0.1:{port_file.read_text().strip()}]", "total_train_steps=2",
             f"hydra.run.dir={run}"], cwd=tmp_path)
        assert sorted(step_records(run)) == [1, 2]
        assert server.poll() is None  # not the run's to stop
    finally:
        server.kill()
        server.wait()


def test_fsdp2_with_two_processes_on_one_server_trains_as_one_process(tmp_path):
    """parallel.fsdp=true with a server backend: the main process pushes the weights, gathered from the shards
    tensor by tensor, and both processes sample on the one server with the weights they train (the recomputed
    log-probs match the server's). Greedy PPO samples what one process samples, so two processes, with disk
    and with xccl updates, train as one: the same answers and rewards at every step, losses, gradient norms
    and the critic's fit within float32 reduction noise. Step 1 tests the update, steps 2 and 3 the pushes."""
    from .test_fsdp import LAUNCH, _run

    args = [*GREEDY_PPO, "rollout.backend=hf:d1p1t1"]
    cli([*args, f"hydra.run.dir={tmp_path / 'one'}"], cwd=tmp_path)
    one = step_records(tmp_path / "one")
    for mode in ("disk", "xccl"):
        run = tmp_path / mode
        _run([*LAUNCH, "-m", "areal_trainer", *args, "parallel.fsdp=true", f"actor.weight_update_mode={mode}",
              f"hydra.run.dir={run}"], tmp_path)
        trains_as_one(one, step_records(run), mode, logp_tol=1e-5)


GREEDY_PPO = ["--config-name", "ppo", *TINY[2:], "train_dataset.batch_size=4", "gconfig.greedy=true",
              "actor.recompute_logprob=true", "total_train_steps=3"]
"""Greedy PPO: what is sampled does not depend on how the prompts are split over processes (or on seeds)."""


def trains_as_one(one: dict, two: dict, label: str, logp_tol: float) -> None:
    """Two processes' step records against one process's: the same answers and rewards at every step; losses,
    gradient norms and the critic's fit within float32 reduction noise."""
    assert sorted(two) == sorted(one) == [1, 2, 3]
    for step, r in two.items():
        o = one[step]
        assert r["rollout/rows"] == o["rollout/rows"] == 8  # 4 prompts x 2 samples, split over the 2 processes
        assert r["mismatch/abs_logp_diff/max"] < logp_tol and r["actor/staleness/max"] == 0
        assert r["rollout/server_requests"] >= 2  # both processes sampled on it
        for key in ("actor/n_valid_tokens", "reward/task", "reward/sampled"):
            assert r[key] == o[key], (label, step, key)
        for key in ("update/grad_norm", "critic/update/grad_norm", "critic/value_loss", "actor/entropy",
                    "critic/return/mean", "advantage/abs_mean"):
            assert r[key] == pytest.approx(o[key], rel=1e-4, abs=1e-6), (label, step, key)
        assert r["critic/explained_variance_before_update"] == pytest.approx(
            o["critic/explained_variance_before_update"], abs=1e-4), (label, step)


def test_an_agent_runs_unchanged_on_a_server(tmp_path):
    """Agents' calls go through the session and its batcher to the server: exact tokens, the server's versions."""
    run = tmp_path / "run"
    cli([*TINY, "rollout.backend=hf:d1p1t1", "rollout.agent=tests.agents.simple.try_again", "total_train_steps=2",
         "actor.recompute_logprob=true", f"hydra.run.dir={run}"], cwd=tmp_path)
    records = step_records(run)
    assert sorted(records) == [1, 2]
    for r in records.values():
        assert r["agent/calls"] >= 1 and r["mismatch/abs_logp_diff/max"] < 1e-3 and r["actor/staleness/max"] == 0
