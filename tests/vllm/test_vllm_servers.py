"""vLLM inference servers (``rollout.backend=vllm:d<N>p1t1``) through the real command line, in ``.venv-vllm``:
GRPO with weights pushed by disk and by a gloo group, the servers' log-probs against the trainer's recomputed ones,
asynchronous training with partial rollouts on a server, and no server left after Ctrl-C."""

from __future__ import annotations

import pytest

from ..e2e.helpers import cli, processes_left, step_records

TINY = ["--config-name", "grpo", "+scale=tiny", "evaluator.freq_steps=null", "saver.freq_steps=null",
        "stats_logger.progress_bar=false"]


@pytest.fixture(scope="module")
def vllm_mod():
    from .test_vllm_engine import SKIP_REASON

    return pytest.importorskip("vllm", reason=SKIP_REASON)


@pytest.mark.parametrize("mode", ["disk", "xccl"])
def test_grpo_on_a_vllm_server_samples_what_the_trainer_computes(vllm_mod, tmp_path, mode):
    run = tmp_path / "run"
    cli([*TINY, "rollout.backend=vllm:d1p1t1", f"actor.weight_update_mode={mode}", "actor.recompute_logprob=true",
         "total_train_steps=3", f"hydra.run.dir={run}"], cwd=tmp_path, env={"AREAL_TEST_SERVERS": str(tmp_path)})
    records = step_records(run)
    assert sorted(records) == [1, 2, 3]
    for r in records.values():
        assert r["mismatch/abs_logp_diff/max"] < 1e-3, r["mismatch/abs_logp_diff/max"]
        assert r["actor/staleness/max"] == 0 and r["perf/weight_update_s"] > 0
    assert "engine vllm" in (run / "servers" / "server-0.log").read_text()
    assert not processes_left(str(tmp_path))


def test_asynchronous_training_on_a_vllm_server_keeps_the_staleness_bound(vllm_mod, tmp_path):
    run = tmp_path / "run"
    cli([*TINY, "rollout.backend=vllm:d1p1t1", "rollout.max_head_offpolicyness=1", "total_train_steps=5",
         f"hydra.run.dir={run}"], cwd=tmp_path)
    records = step_records(run)
    assert sorted(records) == [1, 2, 3, 4, 5]
    assert all(r["actor/staleness/max"] <= 1 for r in records.values())


def test_ctrl_c_leaves_no_vllm_server(vllm_mod, tmp_path):
    from ..e2e.test_servers import long_run, stop_after_first_step

    run = tmp_path / "run"
    stop_after_first_step(long_run(tmp_path, run, "rollout.backend=vllm:d1p1t1"), run, tmp_path, servers=1, wait=600)


def test_fsdp2_with_two_processes_on_a_vllm_server_trains_as_one_process(vllm_mod, tmp_path):
    """FSDP2 over two processes with one vLLM server, weights by xccl (gathered from the shards tensor by tensor):
    greedy PPO trains as one process on the same server does (tests/e2e/test_servers.py)."""
    from ..e2e.test_fsdp import LAUNCH, _run
    from ..e2e.test_servers import GREEDY_PPO, trains_as_one

    args = [*GREEDY_PPO, "rollout.backend=vllm:d1p1t1", "actor.weight_update_mode=xccl"]
    cli([*args, f"hydra.run.dir={tmp_path / 'one'}"], cwd=tmp_path, timeout=900)
    _run([*LAUNCH, "-m", "areal_trainer", *args, "parallel.fsdp=true", f"hydra.run.dir={tmp_path / 'two'}"],
         tmp_path, timeout=900)
    trains_as_one(step_records(tmp_path / "one"), step_records(tmp_path / "two"), "vllm", logp_tol=1e-3)


def test_a_killed_vllm_server_is_replaced(vllm_mod, tmp_path):
    """One of two vLLM servers killed after the first step: its requests go to the other, it is started again and
    given the current weights, and both serve again."""
    from ..e2e.test_servers import kill_one_and_recover, long_run

    run = tmp_path / "run"
    kill_one_and_recover(long_run(tmp_path, run, "rollout.backend=vllm:d2p1t1"), run, tmp_path, wait=600)
