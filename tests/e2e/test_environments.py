"""``environment.type`` through the real command line, offline: each type trains two steps with held-out
evaluation before and after, logging the environment's own metrics; a multi-turn environment under the
asynchronous and lagged sources and every preset; an unknown id stops the run before any model loads."""

import json

import pytest

from .helpers import cli, step_records

TINY = ["--config-name", "grpo", "+scale=tiny", "sft_warmup.steps=0", "trial_name=t"]
TYPES = {
    "reasoning_gym": ["environment.type=reasoning_gym", "environment.id=chain_sum", "+environment.kwargs.min_digits=1",
                      "+environment.kwargs.max_digits=1", "gconfig.max_new_tokens=8"],
    "verifiers": ["environment.type=verifiers", "environment.id=tests.environments.arith_tasks",
                  "gconfig.max_new_tokens=8"],
    "verifiers_tools": ["environment.type=verifiers", "environment.id=examples.environments.calc_taskset",
                        "actor.path=builtin:tiny-tools", "environment.max_turns=2", "gconfig.max_new_tokens=32"],
    "gym": ["environment.type=gym", "environment.id=tests.environments.games:GuessNumber-v0",
            "+environment.kwargs.high=4", "environment.max_turns=2", "gconfig.max_new_tokens=4"],
    "openenv": ["environment.type=openenv", "environment.id=tests.environments.games.GuessEnvironment",
                "+environment.kwargs.high=4", "environment.max_turns=2", "gconfig.max_new_tokens=4"],
}
PARTS = {"reasoning_gym": "score_answer", "verifiers": "correct", "verifiers_tools": "correct", "gym": "return",
         "openenv": "return"}
SIZES = ["environment.size=16", "environment.eval_size=4"]


@pytest.mark.e2e
@pytest.mark.parametrize("kind", sorted(TYPES))
def test_each_environment_type_trains_two_steps_with_its_own_metric(tmp_path, kind):
    cli([*TINY, *TYPES[kind], *SIZES, "total_train_steps=2"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "t"
    steps = step_records(run)
    assert sorted(steps) == [1, 2]
    part = PARTS[kind]
    for record in steps.values():
        assert f"env/{part}" in record and f"eval/env/{part}" in record, sorted(record)
        assert record["rollout/rows"] > 0
    if kind in ("reasoning_gym", "verifiers"):  # single-turn: the reward source environment, its counters
        assert all("reward/environment" in r and r["reward/errors"] == 0 for r in steps.values())
    else:  # multi-turn: agent episodes, their counters and the environment's
        assert all(r["agent/episodes"] == 4 and r["env/episodes"] == 4 and r["env/errors"] == 0
                   for r in steps.values())
    before = step_records(run, "eval/reward")[0]
    assert "eval/accuracy" in before or kind == "verifiers"  # verifiers' weighted reward: its mean is reported
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert samples and all(s["completion"] is not None for s in samples)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", [["rollout.max_head_offpolicyness=1"],
                                  ["rollout.max_head_offpolicyness=1", "rollout.offpolicy_mode=lagged"],
                                  ["rollout.agent_export=concat", "gconfig.n_samples=4"]])
def test_a_game_runs_under_the_asynchronous_and_lagged_sources_and_in_groups(tmp_path, mode):
    cli([*TINY, *TYPES["gym"], *SIZES, "total_train_steps=3", "evaluator.freq_steps=3", *mode], cwd=tmp_path)
    steps = step_records(tmp_path / "outputs" / "grpo" / "t")
    assert sorted(steps) == [1, 2, 3] and all(r["env/episodes"] > 0 for r in steps.values())


PRESETS = ["cispo", "dapo", "distill", "drgrpo", "gspo", "icepop", "kpop", "liteppo", "ppo", "rloo", "sapo"]


@pytest.mark.e2e
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_on_a_multi_turn_environment(tmp_path, preset):
    args = ["--config-name", preset, *TINY[2:], *TYPES["openenv"], *SIZES, "total_train_steps=1",
            "evaluator.freq_steps=null", "valid_dataset=null"]
    cli(args, cwd=tmp_path)
    steps = step_records(tmp_path / "outputs" / preset / "t")
    assert sorted(steps) == [1] and steps[1]["env/episodes"] > 0


@pytest.mark.e2e
def test_an_unknown_environment_stops_the_run_before_any_model_loads(tmp_path):
    proc = cli([*TINY, "environment.type=reasoning_gym", "environment.id=chain_sums"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "environment.id='chain_sums' (reasoning_gym): reasoning-gym has no task 'chain_sums'. Did you mean " \
           "'chain_sum'?" in proc.stderr
    assert not (tmp_path / "outputs").exists()
