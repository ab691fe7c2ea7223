"""Agent runs through the real command line: a lagged-mode agent run killed and resumed ends exactly like the
uninterrupted one; SIGTERM and Ctrl-C stop the episodes and the trainer and keep the newest checkpoint."""

import json
import os
import signal
import threading
import time

import pytest

from .helpers import cli, popen, wait_for

AGENT = ["rollout.agent=tests.agents.simple.try_again", "rollout.agent_export=concat"]
LAGGED = ["rollout.max_head_offpolicyness=2", "rollout.offpolicy_mode=lagged", "rollout.lagged_switch_prob=0.5",
          "gconfig.n_samples=4", "train_dataset.batch_size=4", "actor.ppo_n_minibatches=2"]
COMMON = ["--config-name", "grpo", "+scale=tiny", "total_train_steps=6", "saver.freq_steps=2",
          "evaluator.freq_steps=3", *AGENT, *LAGGED]


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if "reward/task" in r}


def _comparable(record):
    return {k: v for k, v in record.items() if not k.startswith(("time/", "perf/"))}


def test_a_lagged_agent_run_killed_and_resumed_ends_like_the_uninterrupted_one(tmp_path):
    cli([*COMMON, "trial_name=full"], cwd=tmp_path)
    full = _records(tmp_path / "outputs" / "grpo" / "full")
    assert max(r["actor/staleness/max"] for r in full.values()) == 2 and all(r["agent/calls"] > 0 for r in full.values())
    run = tmp_path / "outputs" / "grpo" / "killed"
    proc = popen([*COMMON, "trial_name=killed"], cwd=tmp_path)
    wait_for(run / "checkpoints" / "step_2" / "COMPLETE", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(int(d.split("_")[1]) for d in os.listdir(run / "checkpoints") if d.startswith("step_"))
    assert done and done[-1] < 6, "the run finished before it could be killed"
    cli([*COMMON, "trial_name=killed", "recover.mode=auto"], cwd=tmp_path)
    resumed = _records(run)
    assert sorted(resumed) == list(range(1, 7))
    for step in range(1, 7):
        assert _comparable(resumed[step]) == _comparable(full[step]), step


@pytest.mark.parametrize("sig,code,name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_signal_stops_agent_episodes_and_the_trainer_and_keeps_the_newest_checkpoint(tmp_path, sig, code, name):
    args = ["--config-name", "grpo", "+scale=tiny", "rollout.agent=tests.agents.simple.SlowAgent",
            "+rollout.agent_kwargs.delay=0.5", "rollout.max_head_offpolicyness=1", "total_train_steps=500",
            "saver.freq_steps=2", "evaluator.freq_steps=500", "trial_name=t"]
    run = tmp_path / "outputs" / "grpo" / "t"
    proc = popen(args, cwd=tmp_path)
    wait_for(run / "checkpoints" / "step_2" / "COMPLETE", proc)
    time.sleep(0.3)  # episodes are sleeping in their tools now
    proc.send_signal(sig)
    result = {}
    waiter = threading.Thread(target=lambda: result.update(zip(("out", "err"), proc.communicate())))
    waiter.start()
    waiter.join(60)
    if waiter.is_alive():
        proc.kill()
        raise AssertionError(f"the run did not stop within 60 s of {name}")
    assert proc.returncode == code, result["err"][-3000:]
    assert f"Stopped by {name}; the newest complete checkpoint is" in result["err"]
    assert "Traceback" not in result["err"]
    done = sorted(int(d.split("_")[1]) for d in os.listdir(run / "checkpoints") if d.startswith("step_"))
    assert done and all((run / "checkpoints" / f"step_{s}" / "COMPLETE").exists() for s in done)
