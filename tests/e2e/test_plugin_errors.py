"""A user function whose output breaks its contract stops the real command line with exit code 1 and
one ``Error:`` line that names it (config key and import path) and says what is wrong, never with a
traceback: an advantage stage, a GAE lambda, a whole loss and a surrogate without a gradient, and a
workflow that returns the wrong type. The plugins are in tests/plugins.py."""

import pytest

from .helpers import cli

FAST = ["--config-name", "grpo", "+scale=tiny", "total_train_steps=1", "valid_dataset=null", "sft_warmup.steps=0",
        "saver.freq_steps=null"]


@pytest.mark.parametrize("override,label,problem", [
    ("actor.advantage.outcome_reward_shaping.implementation=tests.plugins.nan_outcome",
     "actor.advantage.outcome_reward_shaping (tests.plugins.nan_outcome)", "OutcomeResult.rewards contains NaN or inf"),
    ("actor.gae_lambda=tests.plugins.per_token_lambda",
     "actor.gae_lambda (tests.plugins.per_token_lambda)", "must return one value per local trajectory"),
    ("actor.loss.compute.implementation=tests.plugins.detached_loss",
     "actor.loss.compute.implementation (tests.plugins.detached_loss)", "the loss has no gradient"),
    ("actor.loss.surrogate.implementation=tests.plugins.detached_surrogate",
     "actor.loss.surrogate (tests.plugins.detached_surrogate)", "the token_loss has no gradient"),
    ("rollout.workflow=tests.plugins.TextWorkflow",
     "rollout.workflow tests.plugins.TextWorkflow", "rollout() returned a list of str"),
], ids=["advantage-stage-nan", "gae-lambda-shape", "loss-without-gradient", "surrogate-without-gradient",
        "workflow-wrong-type"])
def test_a_bad_plugin_output_is_one_error_line(tmp_path, override, label, problem):
    proc = cli([*FAST, override], cwd=tmp_path, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(f"Error: {label}: "), errors[0]
    assert problem in errors[0], errors[0]
