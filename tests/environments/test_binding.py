"""``environment.*`` bound before any model loads: every type's unknown id named with the nearest name and what
is installed, kwargs that do not fit, a missing package named with its extra, the keys an environment replaces,
and what it changes in the defaults (the reward, the answer budget, the verifier)."""

import importlib.util
import os

import pytest

from areal_trainer.components import early_problems, load
from areal_trainer.config.base import ConfigError
from areal_trainer.environments import EXTRAS, missing

RG = ["environment.type=reasoning_gym", "environment.id=chain_sum"]
VF = ["environment.type=verifiers", "environment.id=tests.environments.arith_tasks"]
GYM = ["environment.type=gym", "environment.id=tests.environments.games:GuessNumber-v0"]
OPENENV = ["environment.type=openenv", "environment.id=tests.environments.games.GuessEnvironment"]


def problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load("grpo", overrides)
    return e.value.problems


@pytest.mark.parametrize("overrides,expected", [
    (["environment.type=reasoning_gym", "environment.id=chain_sums"],
     ["Did you mean 'chain_sum'?", "basic_arithmetic"]),
    (["environment.type=gym", "environment.id=CartPol-v1"], ["Did you mean 'CartPole-v1'?", "FrozenLake-v1"]),
    (["environment.type=gym", "environment.id=tests.environments.games:GuessNumbr-v0"],
     ["Did you mean 'GuessNumber-v0'?"]),
    (["environment.type=verifiers", "environment.id=no_such_taskset"],
     ["taskset 'no_such_taskset' not found", "Installed tasksets: harbor, nemo_gym, openenv, textarena"]),
    (["environment.type=verifiers", "environment.id=tests.environments.games"], ["defines no `__all__`"]),
    (["environment.type=verifiers", "environment.id=tests.environments.legacy_env"],
     ["exports a module-level load_environment, the environment API of verifiers before 0.4", "Port it"]),
    (["environment.type=openenv", "environment.id=tests.environments.games.GuessEnviroment"],
     ["Did you mean 'GuessEnvironment'?"]),
    (["environment.type=openenv", "environment.id=http://127.0.0.1:9"], ["no OpenEnv server answers"]),
])
def test_an_unknown_id_is_named_with_the_nearest_one_before_any_model_loads(overrides, expected):
    found = problems(overrides)
    assert len(found) == 1 and found[0].startswith(f"environment.id={overrides[1].split('=', 1)[1]!r}")
    for text in expected:
        assert text in found[0], found[0]


@pytest.mark.parametrize("overrides,expected", [
    ([*RG, "+environment.kwargs.min_digit=1"], "unexpected keyword argument 'min_digit'"),
    ([*VF, "+environment.kwargs.num_task=3"], "fields: num_tasks, split, fail_on, nan_on"),
    ([*GYM, "+environment.kwargs.hgh=3"], "unexpected keyword argument 'hgh'"),
    ([*OPENENV, "+environment.kwargs.hgh=3"], "do not fit"),
    (["environment.type=gym", "environment.id=tests.environments.games.NoSuchGame"], "no Gymnasium environment"),
])
def test_kwargs_that_do_not_fit_the_environment_are_named(overrides, expected):
    found = problems(overrides)
    assert len(found) == 1 and expected in found[0], found


def test_a_missing_package_names_its_extra_in_the_light_check_too(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gymnasium" else real(name, *a))
    message = missing("gym")
    assert f"pip install -e '.[{EXTRAS['gym']}]'" in message and "'.[envs]'" in message
    assert message in early_problems("grpo", GYM)
    assert missing("reasoning_gym") is None


@pytest.mark.parametrize("extra,expected", [
    (["rollout.agent=tests.agents.simple.try_again"], "rollout.agent="),
    (["rollout.workflow=areal_trainer.rollout.workflows.multi_turn.MultiTurnWorkflow"], "rollout.workflow="),
    (["train_dataset.path=data.jsonl"], "train_dataset.path='data.jsonl' with environment.type=reasoning_gym"),
    (["reward.fn=[tests.plugins.digit_share_reward,environment]"], "'environment' must come first"),
    (["environment.split=train"], "environment.split: environment.type=reasoning_gym has no splits"),
    (["environment.max_turns=0"], "environment.max_turns"),
])
def test_keys_an_environment_replaces_cannot_be_set_with_it(extra, expected):
    found = problems([*RG, *extra])
    assert any(expected in p for p in found), found


def test_without_an_environment_its_keys_and_its_reward_are_refused():
    found = problems(["environment.id=chain_sum", "reward.fn=environment"])
    assert any(p.startswith("environment.id: set while environment.type is null") for p in found), found
    assert any(p.startswith("reward.fn: names 'environment'") for p in found), found


def test_an_environment_is_the_reward_and_the_verifier_by_default():
    c = load("grpo", RG)
    assert c.config.reward.fn == "environment" and c.reward.names == ["environment"]
    assert c.config.gconfig.max_new_tokens == 256  # room for reasoning before the answer
    assert (c.verifier.source, c.verifier.verdict) == ("environment", "all_or_nothing")
    assert c.verifier.what == "reasoning_gym:chain_sum"
    assert c.rollout.workflow.__name__ == "RLVRWorkflow"
    # with a function of the user's besides: a weighted sum whose accuracy is still the environment's own
    c = load("grpo", [*RG, "reward.fn=[environment,tests.plugins.digit_share_reward]", "reward.weights=[1.0,0.1]"])
    assert c.reward.names == ["environment", "digit_share_reward"] and c.verifier.source == "environment"


def test_a_verifiers_taskset_without_tools_is_single_turn_and_one_with_tools_runs_as_agents():
    single = load("grpo", VF)
    assert not single.environment.multi_turn and single.verifier.binary_only
    tools = load("grpo", ["environment.type=verifiers", "environment.id=examples.environments.calc_taskset"])
    assert tools.environment.multi_turn and tools.rollout.workflow.__name__ == "EnvironmentWorkflow"
    assert tools.verifier.episodes and tools.verifier.what == "verifiers:examples.environments.calc_taskset episodes"
    for game in (GYM, OPENENV):
        c = load("grpo", game)
        assert c.environment.multi_turn and c.rollout.workflow_kwargs["environment"] is c.environment.adapter
    assert problems([*GYM, "evaluator.verifier=tests.plugins.digit_share_reward"])[0].startswith("evaluator.verifier")


def test_the_rows_of_each_split_are_disjoint_and_the_same_every_time():
    c = load("grpo", [*VF, "environment.size=10", "environment.eval_size=5"])
    train, held_out = c.environment.rows("train"), c.environment.rows("eval")
    assert len(train) == 10 and len(held_out) == 5
    questions = [r.columns["prompt"][-1]["content"] for r in train]
    assert not set(questions) & {r.columns["prompt"][-1]["content"] for r in held_out}
    assert questions == [r.columns["prompt"][-1]["content"] for r in load("grpo", [*VF, "environment.size=10"])
                         .environment.rows("train")]
    own = load("grpo", [*VF, "environment.eval_split=test", "environment.eval_size=5"]).environment
    assert [r.columns["prompt"][-1]["content"] for r in own.rows("eval")] != questions[:5]
    games = load("grpo", [*GYM, "environment.size=3", "environment.eval_size=2", "environment.seed=7"]).environment
    assert [r.columns["env_seed"] for r in games.rows("train")] == [7, 8, 9]
    assert [r.columns["env_seed"] for r in games.rows("eval")] == [10, 11]  # seed + size: never a training seed


def test_the_sections_own_rules():
    from areal_trainer.config.environment import EnvironmentConfig

    assert EnvironmentConfig().check("environment") == []
    found = EnvironmentConfig(type="gym", id="", size=0, answer_pattern="(").check("environment")
    assert [p.split(":")[0] for p in found] == ["environment.id", "environment.size", "environment.answer_pattern"]
    assert EnvironmentConfig(type="verifier", id="x").check("environment")[0].endswith("Did you mean 'verifiers'?")
    assert EnvironmentConfig(kwargs={"a": 1}).check("environment")[0].startswith("environment.kwargs: set while")


EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "environments")


@pytest.mark.parametrize("name,kind,multi_turn", [("chain_sum_smollm2", "reasoning_gym", False),
                                                  ("calc_taskset", "verifiers", True),
                                                  ("guess_game", "gym", True)])
def test_the_examples_configs_build(name, kind, multi_turn):
    import warnings

    from hydra import compose, initialize_config_dir

    from areal_trainer.components import build
    from areal_trainer.config.loader import convert
    from areal_trainer.config.store import register_configs

    register_configs()
    with initialize_config_dir(config_dir=os.path.abspath(EXAMPLES), version_base="1.3"):
        cfg = compose(config_name=name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the examples trip no configuration warning
        c = build(convert(cfg))
    assert c.environment.settings.type == kind and c.environment.multi_turn is multi_turn
    assert c.config.reward.fn == "environment"
    held_out, train = c.environment.rows("eval"), c.environment.rows("train")
    assert len(held_out) in (128, 500) and len(train) in (1000, 2000)
