"""Build once: ``components.build`` binds every plugin and rule exactly once, before anything loads,
reports every problem in one round, and the trainer resolves nothing again."""

import os

import pytest

import areal_trainer.plugins as plugins
from areal_trainer.components import build, early_problems, load, load_config
from areal_trainer.config import ConfigError


@pytest.fixture()
def imports(monkeypatch):
    """Every import path resolved while the fixture is active."""
    seen: list[str] = []
    original = plugins.import_object

    def counting(path, key):
        seen.append(path)
        return original(path, key)

    monkeypatch.setattr(plugins, "import_object", counting)
    return seen


PLUGINS = ["reward.fn=tests.plugins.digit_share_reward", "rollout.dynamic_filter=tests.plugins.every_other_group",
           "actor.loss.surrogate.implementation=examples.custom_loss.spo.spo",
           "+actor.loss.surrogate.kwargs.epsilon=0.2",
           "actor.use_decoupled_loss=false", "actor.rejection_sampling=null",
           "actor.advantage.outcome_reward_shaping.implementation=examples.custom_advantage.my_advantage.length_penalty",
           "+actor.advantage.outcome_reward_shaping.kwargs.coef=0.1",
           "actor.gae_lambda=areal_trainer.advantage.lambda_fn.vapo_length_adaptive_gae",
           "+actor.gae_lambda_kwargs.alpha=0.05"]


def test_every_plugin_is_resolved_exactly_once(imports):
    cfg = load_config("grpo", PLUGINS)
    imports.clear()
    built = build(cfg)
    paths = [p for p in imports if not p.startswith("areal_trainer.rollout.workflows.single_turn")]
    assert sorted(paths) == sorted({p for p in paths}), f"resolved more than once: {paths}"
    assert {"tests.plugins.digit_share_reward", "tests.plugins.every_other_group", "examples.custom_loss.spo.spo",
            "examples.custom_advantage.my_advantage.length_penalty",
            "areal_trainer.advantage.lambda_fn.vapo_length_adaptive_gae"} <= set(paths)
    assert (built.reward.functions[0].fn.__name__ == "digit_share_reward"
            and built.rollout.accept.__name__ == "every_other_group")
    assert built.loss.surrogate.name == "examples.custom_loss.spo.spo"
    assert built.advantage.stages.outcome.builtin is False


def test_the_trainer_resolves_nothing_again(imports, tmp_path):
    from areal_trainer.train.run import Trainer

    built = load("grpo", ["+scale=tiny", *PLUGINS])
    imports.clear()
    Trainer(built, os.path.join(tmp_path, "run"))
    assert imports == []


def test_every_problem_in_one_round():
    """Schema rules, plugins, the loss's and the advantage's rules and the engine's capabilities together."""
    with pytest.raises(ConfigError) as e:
        load("grpo", ["actor.eps_clip=-1", "reward.fn=tests.plugins.no_such_reward",
                      "actor.advantage.estimator.implementation=token_gea", "rollout.backend=vllm",
                      "parallel.fsdp=true", "gconfig.top_p=2"])
    keys = sorted(p.split(":")[0].split(" ")[0] for p in e.value.problems)
    assert keys == ["actor.advantage.estimator.implementation", "actor.eps_clip", "gconfig.top_p", "reward.fn",
                    "rollout.backend=vllm"], e.value.problems
    assert any("Did you mean 'token_gae'" in p for p in e.value.problems)


def test_components_do_not_share_objects_with_the_config():
    built = load("grpo", [])
    norm = built.advantage.stages.settings.adv_norm
    assert norm is not built.config.actor.adv_norm and norm.mean_level == built.config.actor.adv_norm.mean_level
    built.config.actor.adv_norm.mean_level = "group"
    assert built.advantage.stages.settings.adv_norm.mean_level == "batch"


def test_one_failure_policy_is_bound_and_handed_to_the_rewards_the_agent_and_its_tools():
    built = build(load_config("grpo", ["reward.timeout=12", "reward.error_value=-1", "reward.timeout_value=-2",
                                       "reward.max_error_fraction=0.25", "rollout.agent_timeout=7",
                                       "rollout.agent=tests.agents.simple.answer_once"]))
    policy = built.reward.failures
    assert (policy.reward.timeout, policy.reward.error_value, policy.reward.timeout_value,
            policy.reward.max_error_fraction) == (12.0, -1.0, -2.0, 0.25)
    assert (policy.agent.timeout, policy.agent.error_value, policy.agent.max_error_fraction) == (7.0, -1.0, 0.25)
    assert built.rollout.workflow_kwargs["failures"] is policy  # the agent workflow (and its tools) get the same one
    service = built.reward.start(device=None)
    try:
        assert service.failures is policy and [s.pool.timeout for s in service.sources] == [12.0]
    finally:
        service.close()


def test_a_code_box_longer_than_its_reward_call_is_refused_before_anything_loads():
    """The code kind of the failure policy: ``reward.kwargs.timeout`` is the box's limit, and it must end before
    the reward call that runs it (``reward.timeout``)."""
    code = ["reward.fn=areal_trainer.reward.code.unit_tests", "reward.timeout=10"]
    assert load("grpo", code).reward.failures.code.timeout == 5.0  # unit_tests' default
    assert load("grpo", [*code, "+reward.kwargs.timeout=4"]).reward.failures.code.timeout == 4.0
    refused = ("reward.kwargs.timeout: got 10; must be < reward.timeout=10 seconds: unit_tests's box runs inside a "
               "reward call, whose worker would be killed first and score every slow program reward.timeout_value. "
               "Lower reward.kwargs.timeout or raise reward.timeout.")
    with pytest.raises(ConfigError) as e:
        load("grpo", [*code, "+reward.kwargs.timeout=10"])
    assert e.value.problems == [refused]
    assert early_problems("grpo", [*code, "+reward.kwargs.timeout=10"]) == [refused]  # the command line's checks
