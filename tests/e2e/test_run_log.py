"""The run log ``<run dir>/__main__.log`` holds the run's console output: the config's warnings, the
evaluation examples, one line per step (the progress bar's state, however often it redraws) and the
result lines; a run that fails validation still leaves no run directory."""

from .helpers import cli


def test_run_log_holds_the_console_lines_and_one_line_per_step(tmp_path):
    # actor.use_decoupled_loss=false with the preset's rejection_sampling: a start-up warning.
    proc = cli(["--config-name", "grpo", "+scale=tiny", "stats_logger.progress_bar=true",
                "actor.use_decoupled_loss=false", "trial_name=logged"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "logged"
    text = (run / "__main__.log").read_text()
    lines = text.splitlines()
    assert "\r" not in text
    assert f"run directory: {run} (metrics: {run / 'metrics.jsonl'})" in lines  # the final result line
    assert any(line.startswith("held-out accuracy: ") for line in lines)
    assert "actor.rejection_sampling is set but use_decoupled_loss=false: filtering is ignored." in text
    assert [line.split(":")[0] for line in lines if line.startswith("grpo step ")] == ["grpo step 1/2", "grpo step 2/2"]
    assert all(", acc " in line for line in lines if line.startswith("grpo step "))
    assert sum(line.startswith("grpo: ") for line in lines) == 1  # the bar's last state only, not its redraws
    assert sum(line.startswith("grpo: ") for line in proc.stderr.splitlines()) > 2  # the console's redraws
    assert all(line in lines for line in proc.stdout.splitlines())  # everything the console printed


def test_failed_validation_writes_no_run_log(tmp_path):
    proc = cli(["--config-name", "grpo", "+scale=tiny", "gconfig.n_samples=1", "trial_name=bad"], cwd=tmp_path,
               check=False)
    assert proc.returncode == 2 and "gconfig.n_samples=1" in proc.stderr
    assert not (tmp_path / "outputs").exists()
