"""The multi-turn workflow through the real command line: turn-level GAE runs end to end, and a config of
the old form (the workflow's old path, the discount in its kwargs) still runs, with one warning for each."""

import json
import os

import pytest

from .helpers import ROOT, cli

WORKFLOW = "rollout.workflow=areal_trainer.rollout.agents.multi_turn.MultiTurnWorkflow"
OLD_WORKFLOW = "rollout.workflow=areal_trainer.rollout.workflows.multi_turn.MultiTurnWorkflow"
EXAMPLE_DIR = os.path.join(ROOT, "examples", "multi_turn")


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_run(run_dir, max_turns: int) -> None:
    steps = [r for r in _records(run_dir) if r["step"] >= 1 and "reward/task" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 1.0 <= r["rollout/num_turns"] <= max_turns
        assert r["rollout/rows"] == 4.0  # tiny: 2 prompts x 2 samples, one row per episode
    assert any("eval/accuracy" in r for r in _records(run_dir))


def test_multiturn_turn_unit(tmp_path):
    proc = cli(["--config-name", "grpo", "+scale=tiny", WORKFLOW, "actor.gae_timestep_unit=turn", "trial_name=mt"],
               cwd=tmp_path)
    _check_run(tmp_path / "outputs" / "grpo" / "mt", max_turns=2)
    assert "held-out accuracy" in proc.stdout


def test_multiturn_turn_gae_estimator_dynamic_lambda_from_a_config_of_the_old_form(tmp_path):
    proc = cli(["--config-name", "grpo", "+scale=tiny", OLD_WORKFLOW,
                "actor.advantage.estimator.implementation=turn_gae",
                "actor.gae_lambda=areal_trainer.advantage.lambda_fn.relative_position_gae_lambda",
                "+actor.gae_lambda_kwargs={q: 0.5}", "+rollout.workflow_kwargs={max_turns: 3, turn_discount: 0.8}",
                "trial_name=mt"], cwd=tmp_path)
    _check_run(tmp_path / "outputs" / "grpo" / "mt", max_turns=3)
    moved = [x for x in proc.stderr.splitlines() if "MovedModuleWarning" in x]
    assert len(moved) == 1 and ("areal_trainer.rollout.workflows.multi_turn is now "
                                "areal_trainer.rollout.agents.multi_turn") in moved[0]
    old_key = [x for x in proc.stderr.splitlines() if "rollout.workflow_kwargs.turn_discount is now" in x]
    assert len(old_key) == 1 and "set rollout.turn_discount: 0.8" in old_key[0]


def test_example_config_composes(tmp_path):
    out = cli(["--config-dir", EXAMPLE_DIR, "--config-name", "multi_turn", "rollout.workflow_kwargs.max_turns=3",
               "--cfg", "job"], cwd=tmp_path).stdout
    assert "workflow: areal_trainer.rollout.agents.multi_turn.MultiTurnWorkflow" in out
    assert "max_turns: 3" in out and "turn_discount: 0.9" in out and "chat_template_type: hf" in out
    assert "gae_timestep_unit: turn" in out and "relative_position_gae_lambda" in out and "q: 0.5" in out


def test_unknown_workflow_kwarg_fails_fast(tmp_path):
    proc = cli(["--config-name", "grpo", WORKFLOW, "+rollout.workflow_kwargs.max_turn=3"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rollout.workflow_kwargs: the kwargs {'max_turn': 3} do not fit MultiTurnWorkflow" in proc.stderr
    assert "Did you mean 'max_turns'? Accepted keyword arguments: max_turns, turn_discount, feedback." in proc.stderr


@pytest.mark.parametrize("workflow,accepted", [
    ("areal_trainer.rollout.workflows.multi_turn.MultiTurnWorkflow", "max_turns, turn_discount, feedback"),
    ("tests.plugins.TextWorkflow", "none"),
], ids=["multi-turn", "user-class"])
def test_a_workflow_kwarg_it_does_not_take_stops_the_run_before_any_model_loads(tmp_path, workflow, accepted):
    proc = cli(["--config-name", "grpo", "+scale=tiny", f"rollout.workflow={workflow}",
                "rollout.workflow_kwargs={bogus: 1}"], cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]  # a configuration error
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "Error: 1 configuration problem:\n  - rollout.workflow_kwargs: the kwargs {'bogus': 1} do not fit " \
           f"{workflow.rsplit('.', 1)[-1]}(" in proc.stderr
    assert f"got an unexpected keyword argument 'bogus'. Accepted keyword arguments: {accepted}." in proc.stderr
    assert not (tmp_path / "outputs").exists()  # before any model loads: not even a run directory
    assert proc.stdout == ""  # nothing ran: no warm start, no step
