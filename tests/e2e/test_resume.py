"""A run killed with SIGKILL after a checkpoint resumes from it and then matches an uninterrupted run;
every step before the kill equals the uninterrupted run's too (two runs with one seed are identical).
Also for the reproducible off-policy mode (lagging snapshots, switching inside answers)."""


import pytest

from .helpers import cli, comparable, killed_after_checkpoint, step_records

COMMON = ["+scale=tiny", "total_train_steps=6", "saver.freq_steps=2", "evaluator.freq_steps=3"]


LAGGED = ["rollout.max_head_offpolicyness=2", "rollout.offpolicy_mode=lagged", "rollout.lagged_switch_prob=0.5",
          "gconfig.n_samples=4", "train_dataset.batch_size=4", "actor.ppo_n_minibatches=2"]


@pytest.mark.parametrize("algo,extra", [("grpo", []), ("ppo", []),  # ppo: critic, its optimizer and values restored
                                        ("grpo", LAGGED)], ids=["grpo", "ppo", "grpo-lagged"])
def test_sigkill_then_resume_matches_uninterrupted(tmp_path, algo, extra):
    ARGS = ["--config-name", algo, *COMMON, *extra]
    cli([*ARGS, "trial_name=full"], cwd=tmp_path)
    full = step_records(tmp_path / "outputs" / algo / "full", "reward/task")

    run = tmp_path / "outputs" / algo / "killed"
    done = killed_after_checkpoint([*ARGS, "trial_name=killed"], tmp_path, run, 2)
    # A complete checkpoint implies its step's metrics record is on disk.
    assert 2 in step_records(run, "reward/task")
    assert done and done[-1] < 6, "the run finished before it could be killed"

    out = cli([*ARGS, "trial_name=killed", "recover.mode=auto"], cwd=tmp_path)
    assert f"resuming from {run / 'checkpoints' / f'step_{done[-1]}'} (step {done[-1]} of 6)" in out.stdout
    resumed = step_records(run, "reward/task")
    assert sorted(resumed) == list(range(1, 7))
    for step in range(1, 7):
        assert comparable(resumed[step]) == comparable(full[step]), step
    if extra:  # the lagged snapshots did make off-policy data, with answers spanning two versions
        assert max(r["actor/staleness/max"] for r in full.values()) == 2
        assert any(0 < r["staleness/frac_0"] < 1 for r in full.values())
    assert "held-out accuracy" in out.stdout
