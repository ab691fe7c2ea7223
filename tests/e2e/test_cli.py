"""The real command line: printing configs, errors, a short training run, sweeps, bad input."""

import json
import os

from .helpers import cli


def test_cfg_job_shows_seed_switch_values(tmp_path):
    out = cli(["--config-name", "grpo", "scheduler.type=local", "+actor.use_sapo_loss=true", "+actor.sapo_tau_pos=1.0",
               "+actor.sapo_tau_neg=1.05", "actor.use_decoupled_loss=false", "--cfg", "job"], cwd=tmp_path).stdout
    assert "use_sapo_loss: true" in out and "sapo_tau_neg: 1.05" in out and "use_decoupled_loss: false" in out
    out = cli(["--config-name", "grpo", "actor.adv_norm.mean_level=group", "actor.adv_norm.std_level=null",
               "--cfg", "job"], cwd=tmp_path).stdout
    adv = out.split("  adv_norm:\n", 1)[1]
    assert adv.startswith("    mean_level: group\n    mean_leave1out: false\n    std_level: null")


def test_typo_fails_fast_with_suggestion(tmp_path):
    proc = cli(["--config-name", "grpo", "actor.eps_clp=0.3"], cwd=tmp_path, check=False)
    # Before Hydra runs, so before any model loads (the rest of the config is validated in the same round):
    # no run directory was made.
    assert not (tmp_path / "outputs").exists()
    assert proc.returncode != 0
    assert "Did you mean 'actor.eps_clip'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_one_step_training_run(tmp_path):
    proc = cli(["--config-name", "grpo", "+scale=tiny", "total_train_steps=1", "saver.freq_steps=1",
                "trial_name=smoke"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "smoke"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] == 1]
    assert steps and "reward/task" in steps[0] and "actor/clip_frac" in steps[0] and "update/grad_norm" in steps[0]
    assert any("eval/accuracy" in r for r in records if r["step"] == 0)
    assert (run / "curves.png").stat().st_size > 1000
    assert (run / ".hydra" / "config.yaml").exists()
    assert (run / "checkpoints" / "step_1" / "COMPLETE").exists()
    assert (run / "checkpoints" / "step_1" / "actor" / "config.json").exists()
    assert "held-out accuracy" in proc.stdout


def test_tiny_scale_checkpoints_at_the_end_and_the_bar_keeps_the_accuracy(tmp_path):
    # No evaluation between the one before RL (step 0) and the last one: step 1's bar shows step 0's.
    proc = cli(["--config-name", "grpo", "+scale=tiny", "evaluator.freq_steps=null", "stats_logger.progress_bar=true",
                "trial_name=bar"], cwd=tmp_path)
    assert os.listdir(tmp_path / "outputs" / "grpo" / "bar" / "checkpoints") == ["step_2"]
    renders = [r for r in proc.stderr.replace("\r", "\n").splitlines() if "reward=" in r]
    assert len(renders) >= 2 and all("acc=" in r for r in renders), renders


def test_multirun_sweep_two_run_dirs(tmp_path):
    cli(["-m", "algo=grpo,rloo", "+scale=tiny", "total_train_steps=1", "hydra.sweep.dir=sweep"], cwd=tmp_path)
    runs = sorted(os.listdir(tmp_path / "sweep"))
    runs = [r for r in runs if (tmp_path / "sweep" / r).is_dir()]
    assert runs == ["0-grpo-seed1", "1-rloo-seed1"]
    for r in runs:
        assert (tmp_path / "sweep" / r / "metrics.jsonl").stat().st_size > 0
        log = (tmp_path / "sweep" / r / "__main__.log").read_text()  # each job's run log holds its own lines
        assert f"run directory: {tmp_path / 'sweep' / r} " in log and log.count("run directory: ") == 1
    table = (tmp_path / "sweep" / "comparison.md").read_text()
    assert "| grpo | 1 |" in table and "| rloo | 1 |" in table
    assert (tmp_path / "sweep" / "comparison.png").stat().st_size > 1000


def test_sweep_through_the_submitit_launcher(tmp_path):
    """The Slurm launcher's code path, run locally: each job in its own submitit process."""
    cli(["-m", "hydra/launcher=submitit_local", "algo=grpo,rloo", "+scale=tiny", "total_train_steps=1",
         "hydra.sweep.dir=sweep"], cwd=tmp_path)
    for r in ("0-grpo-seed1", "1-rloo-seed1"):
        assert (tmp_path / "sweep" / r / "metrics.jsonl").stat().st_size > 0
    assert (tmp_path / "sweep" / ".submitit").is_dir()
    assert "| rloo | 1 |" in (tmp_path / "sweep" / "comparison.md").read_text()


def test_bad_reward_path_and_model_path(tmp_path):
    proc = cli(["--config-name", "grpo", "reward.fn=mypkg.rewards.score"], cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "reward.fn: module 'mypkg.rewards' not found" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli(["--config-name", "grpo", "+scale=tiny", "actor.path=./no/such/model"], cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "actor.path: './no/such/model' does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dataset_row_without_answer(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n"
                    + json.dumps({"question": "2+2?"}) + "\n")
    proc = cli(["--config-name", "grpo", "+scale=tiny", f"train_dataset.path={data}",
                "allow_builtin_model_on_any_data=true"], cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "line 2 of" in proc.stderr and "no 'answer' value" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_existing_checkpoint_is_not_overwritten(tmp_path):
    cli(["--config-name", "grpo", "+scale=tiny", "total_train_steps=1", "saver.freq_steps=1", "trial_name=t"],
        cwd=tmp_path)
    marker = tmp_path / "outputs" / "grpo" / "t" / "checkpoints" / "step_1" / "COMPLETE"
    before = marker.stat().st_mtime_ns
    proc = cli(["--config-name", "grpo", "+scale=tiny", "total_train_steps=1", "trial_name=t"], cwd=tmp_path,
               check=False)
    assert proc.returncode != 0 and "recover.mode=auto" in proc.stderr
    assert marker.stat().st_mtime_ns == before


def test_non_finite_updates_stop_the_run_also_when_a_step_has_fewer_rows_than_minibatches(tmp_path):
    """A loss whose gradient is NaN makes every optimizer step non-finite (each skipped, the weights
    untouched). The dynamic filter keeps one of the two prompts of a step: 2 rows for 4 minibatches, so
    each update runs 2 optimizer steps, both skipped. Two such updates in a row must stop the run."""
    proc = cli(["--config-name", "grpo", "+scale=tiny", "total_train_steps=6", "trial_name=nan", "dynamic_bs=true",
                "rollout.dynamic_filter=tests.plugins.every_other_group", "actor.ppo_n_minibatches=4",
                "actor.loss.compute.implementation=tests.plugins.nan_gradient_loss",
                "actor.max_consecutive_nonfinite_steps=2", "saver.freq_steps=null",
                "evaluator.freq_steps=null", "evaluator.eval_before_train=false", "valid_dataset=null"],
               cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "2 consecutive optimizer steps had a non-finite loss or gradient norm; stopping at step 2" in proc.stderr
    assert "Traceback" not in proc.stderr
