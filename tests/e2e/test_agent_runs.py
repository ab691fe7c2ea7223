"""Agent runs through the real command line: a lagged-mode agent run killed and resumed ends exactly like the
uninterrupted one; SIGTERM and Ctrl-C stop the episodes and the trainer and keep the newest checkpoint."""

import signal

import pytest

from .helpers import (
    checkpoint_steps,
    cli,
    comparable,
    ended,
    killed_after_checkpoint,
    popen,
    step_records,
    wait_for,
    wait_until,
)

AGENT = ["rollout.agent=tests.agents.simple.try_again", "rollout.agent_export=concat"]
LAGGED = ["rollout.max_head_offpolicyness=2", "rollout.offpolicy_mode=lagged", "rollout.lagged_switch_prob=0.5",
          "gconfig.n_samples=4", "train_dataset.batch_size=4", "actor.ppo_n_minibatches=2"]
COMMON = ["--config-name", "grpo", "+scale=tiny", "total_train_steps=6", "saver.freq_steps=2",
          "evaluator.freq_steps=3", *AGENT, *LAGGED]


def test_a_lagged_agent_run_killed_and_resumed_ends_like_the_uninterrupted_one(tmp_path):
    cli([*COMMON, "trial_name=full"], cwd=tmp_path)
    full = step_records(tmp_path / "outputs" / "grpo" / "full", "reward/task")
    assert (max(r["actor/staleness/max"] for r in full.values()) == 2
            and all(r["agent/calls"] > 0 for r in full.values()))
    run = tmp_path / "outputs" / "grpo" / "killed"
    done = killed_after_checkpoint([*COMMON, "trial_name=killed"], tmp_path, run, 2)
    assert done and done[-1] < 6, "the run finished before it could be killed"
    cli([*COMMON, "trial_name=killed", "recover.mode=auto"], cwd=tmp_path)
    resumed = step_records(run, "reward/task")
    assert sorted(resumed) == list(range(1, 7))
    for step in range(1, 7):
        assert comparable(resumed[step]) == comparable(full[step]), step


@pytest.mark.parametrize("sig,code,name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_signal_stops_agent_episodes_and_the_trainer_and_keeps_the_newest_checkpoint(tmp_path, sig, code, name):
    in_tool = tmp_path / "in_tool"
    args = ["--config-name", "grpo", "+scale=tiny", "rollout.agent=tests.plugins.ToolMarking",
            f"+rollout.agent_kwargs.mark={in_tool}", "+rollout.agent_kwargs.delay=0.5",
            "rollout.max_head_offpolicyness=1", "total_train_steps=500", "saver.freq_steps=2",
            "evaluator.freq_steps=500", "trial_name=t"]
    run = tmp_path / "outputs" / "grpo" / "t"
    proc = popen(args, cwd=tmp_path)
    wait_for(run / "checkpoints" / "step_2" / "COMPLETE", proc)
    in_tool.unlink(missing_ok=True)
    wait_until(in_tool.exists, proc, "an episode in its tool")  # one has entered its tool since the checkpoint
    proc.send_signal(sig)
    err = ended(proc, name)
    assert proc.returncode == code, err[-3000:]
    assert f"Stopped by {name}; the newest complete checkpoint is" in err
    assert "Traceback" not in err
    done = checkpoint_steps(run)
    assert done and all((run / "checkpoints" / f"step_{s}" / "COMPLETE").exists() for s in done)
