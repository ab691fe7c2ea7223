"""Asynchronous training through the real command line: staleness logged and bounded, no prompt
lost or trained twice across a SIGKILL and resume (eta = 2), SIGTERM stops both sides cleanly, and a
step with nothing to train on still advances the policy version and the LR schedule."""

import signal

import pytest
import torch

from .helpers import (
    HANG,
    checkpoint_steps,
    cli,
    ended,
    killed_after_checkpoint,
    popen,
    step_records,
    wait_for,
)

ASYNC = ["+scale=tiny", "rollout.max_head_offpolicyness=2"]

def test_async_run_logs_staleness_within_eta(tmp_path):
    cli(["--config-name", "grpo", *ASYNC, "total_train_steps=6", "trial_name=a"], cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "grpo" / "a")
    assert sorted(records) == list(range(1, 7))
    for r in records.values():
        assert r["actor/staleness/max"] <= 2
        assert abs(sum(r[f"staleness/frac_{d}"] for d in range(3)) - 1) < 1e-6
        for k in ("rollout/overlap_frac", "rollout/trainer_idle_frac", "rollout/generator_idle_frac",
                  "time/rollout_wait", "rollout/buffered_groups", "mismatch/abs_logp_diff"):
            assert k in r, k
    assert max(r["actor/staleness/max"] for r in records.values()) >= 1  # it really ran ahead


def test_sigkill_with_eta_2_loses_no_prompt_and_trains_none_twice(tmp_path):
    # One epoch: 16 prompts, 2 per step, 8 steps; the rollout thread runs up to 2 versions ahead.
    args = ["--config-name", "grpo", *ASYNC, "train_dataset.max_rows=16", "total_train_steps=8", "saver.freq_steps=2",
            "evaluator.freq_steps=8", "trial_name=k"]
    run = tmp_path / "outputs" / "grpo" / "k"
    done = killed_after_checkpoint(args, tmp_path, run, 4)
    assert done[-1] < 8, "the run finished before it could be killed"
    state = torch.load(run / "checkpoints" / f"step_{done[-1]}" / "trainer_state.pt", weights_only=False)
    assert state["source"]["loader"]["requeue"], "prompts were in flight at the checkpoint"
    out = cli([*args, "recover.mode=auto"], cwd=tmp_path)
    records = step_records(run)
    assert sorted(records) == list(range(1, 9))
    trained = sorted(i for r in records.values() for i in r["data/prompt_ids"])
    assert trained == list(range(16))  # every prompt of the epoch exactly once
    assert all(r["actor/staleness/max"] <= 2 for r in records.values())
    assert "held-out accuracy" in out.stdout


@pytest.mark.parametrize("sig,code,name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_signal_stops_both_sides_and_keeps_the_newest_checkpoint(tmp_path, sig, code, name):
    args = ["--config-name", "grpo", *ASYNC, "total_train_steps=500", "saver.freq_steps=2", "evaluator.freq_steps=500",
            "trial_name=t"]
    run = tmp_path / "outputs" / "grpo" / "t"
    proc = popen(args, cwd=tmp_path)
    wait_for(run / "checkpoints" / "step_2" / "COMPLETE", proc)
    proc.send_signal(sig)
    err = ended(proc, name)
    assert proc.returncode == code, err[-3000:]
    assert f"Stopped by {name}; the newest complete checkpoint is" in err and "Traceback" not in err
    done = checkpoint_steps(run)
    assert done and all((run / "checkpoints" / f"step_{s}" / "COMPLETE").exists() for s in done)
    cli(["--config-name", "grpo", *ASYNC, f"total_train_steps={done[-1] + 1}", "saver.freq_steps=2",
         "evaluator.freq_steps=500", "trial_name=t", "recover.mode=auto"], cwd=tmp_path)
    assert max(step_records(run)) == done[-1] + 1


def test_a_reward_that_hangs_in_the_trainer_process_stops_the_run_naming_where_it_hangs(tmp_path):
    """With ``reward.workers=0`` (debugging) nothing can kill the call: the rollout watchdog stops the run
    (the reward would sleep for an hour; ``cli`` fails the test long before)."""
    proc = cli(["--config-name", "grpo", *ASYNC, "reward.fn=tests.plugins.hanging_reward", "reward.workers=0",
                "rollout.request_timeout=3", "valid_dataset=null", "evaluator.freq_steps=null",
                "evaluator.eval_before_train=false", "trial_name=h"], cwd=tmp_path, check=False, timeout=HANG)
    assert proc.returncode == 1
    assert "no progress for" in proc.stderr and "rollout.request_timeout=3" in proc.stderr
    assert "hanging_reward" in proc.stderr


def test_multi_turn_workflow_runs_asynchronously(tmp_path):
    cli(["--config-name", "grpo", "+scale=tiny", "rollout.max_head_offpolicyness=1", "total_train_steps=4",
         "rollout.workflow=areal_trainer.rollout.agents.multi_turn.MultiTurnWorkflow",
         "actor.gae_timestep_unit=turn", "trial_name=mt"], cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "grpo" / "mt")
    assert sorted(records) == [1, 2, 3, 4]
    assert all(r["actor/staleness/max"] <= 1 and r["rollout/num_turns"] >= 1 for r in records.values())


def test_a_step_with_nothing_to_train_on_advances_version_and_schedule(tmp_path):
    cli(["--config-name", "grpo", "+scale=tiny", "total_train_steps=3", "saver.freq_steps=1", "dynamic_bs=true",
         "rollout.dynamic_filter=tests.plugins.reject_all", "actor.optimizer.lr_scheduler_type=linear",
         "trial_name=e"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "e"
    records = step_records(run)
    assert all(r["update/skipped_empty_batch"] == 1 for r in records.values())
    lrs = [records[s]["lr"] for s in (1, 2, 3)]
    assert lrs[0] > lrs[1] > lrs[2]  # the schedule moved on every step
    state = torch.load(run / "checkpoints" / "step_3" / "trainer_state.pt", weights_only=False)
    assert state["version"] == state["step"] == 3
    assert state["scheduler"]["last_epoch"] == 3
