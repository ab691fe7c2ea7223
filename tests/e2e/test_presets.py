"""Every algorithm preset trains on the built-in task through the real command line, with finite
metrics; the custom-advantage example runs from YAML paths; DAPO's filter is applied."""

import json
import math
import os

import pytest

from .helpers import cli

ALGOS = ["ppo", "grpo", "drgrpo", "liteppo", "rloo", "dapo", "sapo", "gspo", "icepop", "kpop"]


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("presets")
    cli(["-m", f"algo={','.join(ALGOS)}", "+scale=tiny", "total_train_steps=2", "saver.freq_steps=null",
         "hydra.sweep.dir=sweep"], cwd=tmp, timeout=900)
    return tmp / "sweep"


@pytest.mark.parametrize("i,algo", list(enumerate(ALGOS)))
def test_preset_trains_with_finite_metrics(sweep, i, algo):
    records = _records(sweep / f"{i}-{algo}-seed1")
    steps = [r for r in records if "reward/task" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for k, v in r.items():
            if isinstance(v, float) and not k.endswith(("/min", "/max")):
                assert math.isfinite(v), (algo, k, v)
        assert r.get("update/skipped_steps", 0) == 0
    if algo == "ppo":
        assert "critic/value_loss" in steps[-1]
    if algo == "sapo":
        assert "actor/sapo/gate" in steps[-1]
    if algo in ("icepop", "kpop"):
        assert "actor/rejection/masked_frac" in steps[-1]
    if algo == "dapo":
        assert "rollout/accept_rate" in steps[-1]


def test_custom_advantage_example_from_the_command_line(tmp_path):
    mod = "examples.custom_advantage.my_advantage"
    cli(["--config-name", "grpo", "+scale=tiny", "trial_name=custom",
         f"actor.advantage.outcome_reward_shaping.implementation={mod}.scale_outcome",
         "+actor.advantage.outcome_reward_shaping.kwargs.factor=0.5",
         f"actor.advantage.estimator.implementation={mod}.token_gae_kl_outside",
         "actor.gae_lambda=areal_trainer.advantage.lambda_fn.vapo_length_adaptive_gae",
         "+actor.gae_lambda_kwargs.alpha=0.05"], cwd=tmp_path)
    records = _records(tmp_path / "outputs" / "grpo" / "custom")
    assert any("reward/task" in r for r in records)
