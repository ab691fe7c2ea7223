"""Build once: ``components.build`` binds every plugin and rule exactly once, before anything loads,
reports every problem in one round, and the trainer resolves nothing again."""

import os

import pytest

import areal_trainer.plugins as plugins
from areal_trainer.components import build, load, load_config
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
