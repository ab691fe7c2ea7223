"""Every shipped config composes and validates; every override style works."""

import glob
import os
import warnings

import pytest

from areal_trainer.components import load_config
from areal_trainer.config import ConfigError, PPOActorConfig, TrainerConfig

CONF = os.path.join(os.path.dirname(__file__), "..", "..", "conf")
TOP_LEVEL = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(CONF, "*.yaml")))
ALGOS = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(CONF, "algo", "*.yaml")))


def test_areal_algorithms_shipped_and_every_preset_has_a_top_level_config():
    assert {"ppo", "grpo", "drgrpo", "liteppo", "rloo", "dapo", "sapo", "gspo", "icepop", "kpop"} <= set(ALGOS)
    assert set(TOP_LEVEL) == set(ALGOS) | {"config"}


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_every_top_level_config_validates(name):
    cfg = load_config(name)
    assert isinstance(cfg, TrainerConfig)
    assert isinstance(cfg.actor, PPOActorConfig)
    assert cfg.algorithm == ("grpo" if name == "config" else name)


@pytest.mark.parametrize("algo", ALGOS)
def test_algo_group_override(algo):
    assert load_config("config", [f"algo={algo}"]).algorithm == algo


def test_grpo_preset_values():
    a = load_config("grpo").actor
    assert (a.reward_norm.mean_level, a.reward_norm.std_level, a.reward_norm.group_size) == ("group", "group", 8)
    assert (a.adv_norm.mean_level, a.adv_norm.std_level) == ("batch", "batch")
    assert a.use_decoupled_loss and a.recompute_logprob and a.kl_ctl == 0.0 and a.eps_clip == 0.4
    assert a.rejection_sampling.metric == "ratio" and a.rejection_sampling.upper == 5.0


@pytest.mark.parametrize("prefix", ["", "+", "++"])
@pytest.mark.parametrize("key,value,expect", [
    ("actor.use_sapo_loss", "true", True),            # not set by the grpo YAML
    ("actor.eps_clip", "0.3", 0.3),                   # set by the grpo YAML
    ("actor.importance_sampling_level", "sequence", "sequence"),
    ("seed", "7", 7),
    ("actor.adv_norm.std_level", "null", None),
    ("actor.optimizer.lr", "2e-5", 2e-5),
])
def test_override_styles(prefix, key, value, expect):
    extra = ["actor.use_decoupled_loss=false"] if key == "actor.use_sapo_loss" else []
    cfg = load_config("grpo", [f"{prefix}{key}={value}", *extra])
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    assert obj == expect


def test_seed_switch_commands_verbatim():
    sapo = load_config("grpo", ["scheduler.type=local", "+actor.use_sapo_loss=true", "+actor.sapo_tau_pos=1.0",
                                "+actor.sapo_tau_neg=1.05", "actor.use_decoupled_loss=false"])
    assert sapo.actor.use_sapo_loss and sapo.actor.sapo_tau_neg == 1.05 and not sapo.actor.use_decoupled_loss
    dr = load_config("grpo", ["scheduler.type=local", "actor.adv_norm.mean_level=group",
                              "actor.adv_norm.std_level=null"])
    assert dr.actor.adv_norm.mean_level == "group" and dr.actor.adv_norm.std_level is None
    gspo = load_config("grpo", ["scheduler.type=local", "+actor.importance_sampling_level=sequence"])
    assert gspo.actor.importance_sampling_level == "sequence"


def test_nested_override_into_null_section():
    cfg = load_config("ppo", ["actor.reward_norm.mean_level=group", "actor.reward_norm.std_level=null"])
    assert cfg.actor.reward_norm.mean_level == "group" and cfg.actor.reward_norm.std_level is None


def _problems(overrides, name="grpo"):
    with pytest.raises(ConfigError) as info:
        load_config(name, overrides)
    return info.value.problems


def test_unknown_key_suggests_closest():
    (msg,) = _problems(["actor.eps_clp=0.3"])
    assert "actor.eps_clp" in msg and "Did you mean 'actor.eps_clip'" in msg


def test_unknown_key_with_plus_is_still_rejected():
    (msg,) = _problems(["+actor.not_a_key=1"])
    assert "actor.not_a_key: not a configuration key" in msg


def test_wrong_type_and_all_problems_together():
    problems = _problems(["actor.eps_clip=abc", "gconfig.n_samples=1.5", "actor.adv_norm.mean_lvl=batch"])
    assert len(problems) == 3
    assert "actor.eps_clip: got 'abc', which is not a valid float" in problems[0]


def test_bad_enum_values_reported_together():
    problems = _problems(["actor.importance_sampling_level=seq", "actor.kl_estimator=k4",
                          "actor.adv_norm.mean_level=batchh", "scheduler.type=cluster"])
    text = "\n".join(problems)
    assert "actor.importance_sampling_level: got 'seq'" in text
    assert "actor.kl_estimator: got 'k4'" in text
    assert "Did you mean 'batch'" in text
    assert "scheduler.type: got 'cluster'; must be one of null, 'local', 'ray', 'slurm'" in text


def test_cross_field_rules():
    text = "\n".join(_problems(["actor.kl_ctl=0.1", "actor.c_clip=0.5", "+actor.use_sapo_loss=true",
                                "actor.rejection_sampling.metric=binary_kl", "actor.rejection_sampling.lower=0.1",
                                "actor.overlong_reward_penalty=true"]))
    assert "needs a reference model" in text
    assert "actor.c_clip: got 0.5" in text
    assert "SAPO is not compatible with use_decoupled_loss=true" in text
    assert "binary_kl' (KPop) masks only above `upper`" in text
    assert "overlong_reward_penalty=true needs actor.overlong_tokens" in text


def test_clamp_needs_ratio_and_ratio_upper():
    text = "\n".join(_problems(["actor.rejection_sampling.action=clamp", "actor.rejection_sampling.metric=kl_k2",
                                "actor.rejection_sampling.upper=0"]))
    assert "action='clamp' only supports metric='ratio'" in text
    assert "actor.rejection_sampling.upper: got 0.0; must be > 0 for metric 'kl_k2'." in text
    (msg,) = _problems(["actor.rejection_sampling.upper=1.0"])
    assert "actor.rejection_sampling.upper: got 1.0; must be > 1.0 for metric 'ratio' (a ratio of 1 means " in msg


def test_plugin_errors_name_the_key():
    text = "\n".join(_problems(["reward.fn=no_such_pkg.rewards.fn",
                                "rollout.dynamic_filter=areal_trainer.rollout.filters.nope"]))
    assert "reward.fn: module 'no_such_pkg.rewards' not found" in text
    assert "rollout.dynamic_filter: module 'areal_trainer.rollout.filters' has no attribute 'nope'" in text


def test_a_workflow_must_offer_the_rollout_method():
    text = "\n".join(_problems(["rollout.workflow=tests.plugins.NoRolloutWorkflow"]))
    assert "rollout.workflow: 'tests.plugins.NoRolloutWorkflow' has no rollout(samples, gconfig) method" in text
    text = "\n".join(_problems(["rollout.workflow=tests.plugins.WrongRolloutWorkflow"]))
    assert "WrongRolloutWorkflow.rollout must take (samples, gconfig)" in text


def test_rejection_sampling_without_decoupled_only_warns():
    with pytest.warns(UserWarning, match="filtering is ignored"):
        load_config("grpo", ["actor.use_decoupled_loss=false"])


def test_builtin_task_tuning_follows_the_chosen_algorithm():
    """conf/algo_tuning/ppo.yaml applies whichever way ppo is chosen, after the preset, and stays
    overridable; the preset itself keeps AReaL's critic lr = actor lr."""
    assert load_config("ppo").critic.optimizer.lr == 3e-3
    assert load_config("config", ["algo=ppo"]).critic.optimizer.lr == 3e-3
    assert load_config("ppo", ["critic.optimizer.lr=5e-4"]).critic.optimizer.lr == 5e-4
    assert load_config("ppo", ["~algo_tuning"]).critic.optimizer.lr == load_config("ppo").actor.optimizer.lr
    assert load_config("grpo").critic is None


def test_async_rollout_settings_and_their_defaults():
    cfg = load_config("grpo", ["rollout.max_head_offpolicyness=2"])
    r = cfg.rollout
    assert (r.max_head_offpolicyness, r.offpolicy_mode, r.partial_rollout, r.dtype) == (2, "concurrent", True, None)
    assert r.consumer_batch_size is None and r.max_concurrent_rollouts is None and r.queue_size is None
    assert load_config("grpo").rollout.max_head_offpolicyness == 0  # synchronous by default


def test_bad_async_settings_are_reported_together_naming_each_key():
    with pytest.raises(ConfigError) as info:
        load_config("grpo", ["rollout.max_head_offpolicyness=-1", "rollout.max_concurrent_rollouts=0",
                             "rollout.queue_size=4", "rollout.consumer_batch_size=8", "rollout.offpolicy_mode=ahead",
                             "rollout.dtype=int8", "rollout.lagged_switch_prob=2", "rollout.request_timeout=0"])
    msg = str(info.value)
    for needle in ("rollout.max_head_offpolicyness: got -1; must be an integer >= 0 (0 = synchronous",
                   "rollout.max_concurrent_rollouts: got 0; must be >= 1",
                   "rollout.queue_size=4 is smaller than one batch (train_dataset.batch_size=16",
                   "rollout.consumer_batch_size=8 differs from train_dataset.batch_size=16",
                   "rollout.offpolicy_mode", "rollout.dtype", "rollout.lagged_switch_prob: got 2.0",
                   "rollout.request_timeout: got 0.0"):
        assert needle in msg, needle


def test_options_the_vllm_backend_cannot_honour_are_configuration_errors():
    """The engine registry's capabilities decide, before anything loads (rollout/engines/backends.py)."""
    with pytest.raises(ConfigError, match="lagged_switch_prob > 0 needs a backend that can switch weights inside a "
                                          "generation call, which rollout.backend=vllm cannot. Use rollout.backend=hf"):
        load_config("grpo", ["rollout.backend=vllm", "rollout.max_head_offpolicyness=2",
                             "rollout.offpolicy_mode=lagged", "rollout.lagged_switch_prob=0.5"])
    with pytest.raises(ConfigError, match=r"rollout.backend=vllm does not support a policy sharded with FSDP2 "
                                          r"\(parallel.fsdp=true\) yet; use rollout.backend=hf"):
        load_config("grpo", ["rollout.backend=vllm", "parallel.fsdp=true"])
    with pytest.raises(ConfigError, match="rollout.backend: got 'vlm'; must be one of 'hf', 'vllm'. "
                                          "Did you mean 'vllm'"):
        load_config("grpo", ["rollout.backend=vlm"])


def test_null_sections_are_filled_only_where_hydra_applies_overrides():
    """The fill hooks Hydra's override step (pinned hydra-core 1.3), not OmegaConf itself."""
    import inspect

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    from areal_trainer.config import store

    load_config("grpo")  # registers the hook
    assert OmegaConf.update.__module__.startswith("omegaconf")  # OmegaConf is untouched
    assert ConfigLoaderImpl._apply_overrides_to_config is store._apply_overrides_filling_null_sections
    assert list(inspect.signature(store._ORIGINAL_APPLY).parameters) == ["overrides", "cfg"]
    cfg = load_config("ppo", ["actor.reward_norm.mean_level=group"])  # null in the ppo preset
    assert (cfg.actor.reward_norm.mean_level, cfg.actor.reward_norm.std_level) == ("group", "batch")  # defaults
    assert load_config("grpo", ["actor.reward_norm.mean_level=batch"]).actor.reward_norm.std_level == "group"


def test_agent_problems_are_all_reported_before_anything_loads():
    text = "\n".join(_problems(["rollout.agent=tests.agents.simple.nope", "rollout.tool_call_parser=qwen_xml",
                                "rollout.agent_export=merged", "rollout.agent_timeout=0", "rollout.turn_discount=1.5",
                                "rollout.chat_template_type=jinja"]))
    assert "rollout.agent: module 'tests.agents.simple' has no attribute 'nope'" in text
    assert "rollout.tool_call_parser" in text and "'qwen_xml'" in text and "hermes" in text
    assert "rollout.agent_export" in text and "'merged'" in text
    assert "rollout.agent_timeout: got 0" in text and "rollout.turn_discount: got 1.5" in text
    assert "rollout.chat_template_type" in text and "'jinja'" in text and "concat" in text
    text = "\n".join(_problems(["rollout.agent=tests.rollout.test_agent.no_client"]))
    assert ("rollout.agent: 'tests.rollout.test_agent.no_client' takes (data); it must take data and either "
            "client" in text)
    text = "\n".join(_problems(["rollout.agent=tests.agents.simple.try_again",
                                "rollout.workflow=areal_trainer.rollout.agents.multi_turn.MultiTurnWorkflow"]))
    assert "rollout.agent='tests.agents.simple.try_again' and rollout.workflow=" in text and "set only one" in text


def test_agent_processes_are_checked_against_the_agent_before_anything_loads():
    text = "\n".join(_problems(["rollout.agent=tests.agents.two_forms.run_client", "rollout.agent_processes=2"]))
    assert "rollout.agent_processes=2: tests.agents.two_forms.run_client takes a client" in text
    assert "set rollout.agent_processes=0, or write the agent as run(data, *, base_url, api_key)" in text
    text = "\n".join(_problems(["rollout.agent=tests.agents.two_forms.HTTP", "rollout.agent_processes=-1"]))
    assert "rollout.agent_processes: got -1" in text and "takes a client" not in text
    text = "\n".join(_problems(["rollout.agent_processes=2"]))
    assert "rollout.agent_processes=2 is set but rollout.agent is null" in text
    assert load_config("grpo", ["rollout.agent=tests.agents.two_forms.HTTP", "rollout.agent_processes=2"]
                       ).rollout.agent_processes == 2


def test_an_agent_binds_to_the_agent_workflow_with_its_settings():
    from areal_trainer.components import load
    from areal_trainer.rollout.agents.workflow import AgentWorkflow

    built = load("grpo", ["rollout.agent=tests.agents.simple.SlowAgent", "+rollout.agent_kwargs.calls=3",
                          "rollout.agent_export=concat", "rollout.turn_discount=0.9", "rollout.agent_timeout=30"])
    parts = built.rollout
    assert parts.workflow is AgentWorkflow
    kw = parts.workflow_kwargs
    assert kw["agent"].kwargs == {"calls": 3} and kw["agent"].style == "client" and kw["agent"].is_class
    assert (kw["export"], kw["turn_discount"], kw["tool_call_parser"]) == ("concat", 0.9, "hermes")
    assert kw["failures"].agent.timeout == 30.0 and kw["failures"] is built.reward.failures  # the run's one policy
    assert kw["chat_template_type"] == "hf" and parts.turn_discount == 0.9 and kw["processes"] == 0
    parts = load("grpo", ["rollout.agent=tests.agents.simple.SlowAgent", "rollout.chat_template_type=concat"]).rollout
    assert parts.workflow_kwargs["chat_template_type"] == "concat"
    assert parts.workflow_kwargs["turn_discount"] == parts.turn_discount == 1.0  # null: no discount


MULTI_TURN = "rollout.workflow=areal_trainer.rollout.agents.multi_turn.MultiTurnWorkflow"


@pytest.mark.parametrize("overrides, handed", [
    ([], None),  # null: the class's own default (0.9)
    (["rollout.turn_discount=0.8"], 0.8),
    (["+rollout.workflow_kwargs.turn_discount=0.7"], 0.7),  # the old place, with a warning
    (["+rollout.workflow_kwargs.turn_discount=0.7", "rollout.turn_discount=0.7"], 0.7),
])
def test_the_multi_turn_workflow_takes_the_one_discount_key(overrides, handed):
    from areal_trainer.components import load

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = load("grpo", [MULTI_TURN, *overrides]).rollout
    assert parts.workflow_kwargs.get("turn_discount") == handed
    old_place = [str(w.message) for w in caught if "workflow_kwargs.turn_discount" in str(w.message)]
    if any("workflow_kwargs" in o for o in overrides):
        assert old_place == ["rollout.workflow_kwargs.turn_discount is now rollout.turn_discount; set "
                             "rollout.turn_discount: 0.7 and drop rollout.workflow_kwargs.turn_discount (the old "
                             "place goes in a later release)."]
    else:
        assert old_place == []


def test_two_different_discounts_are_an_error():
    (text,) = [p for p in _problems([MULTI_TURN, "+rollout.workflow_kwargs.turn_discount=0.7",
                                     "rollout.turn_discount=0.9"]) if "turn_discount" in p]
    assert text == ("rollout.workflow_kwargs.turn_discount=0.7 and rollout.turn_discount=0.9 differ; "
                    "rollout.turn_discount is the one discount key: drop rollout.workflow_kwargs.turn_discount.")


def test_a_workflow_without_turn_discount_gets_none_of_it():
    from areal_trainer.components import load

    assert "turn_discount" not in load("grpo", ["rollout.turn_discount=0.8"]).rollout.workflow_kwargs


def test_the_kwargs_of_a_list_of_reward_functions_name_the_functions():
    fns = "reward.fn=[tests.plugins.tolerant,tests.plugins.exact]"
    problems = _problems([fns, "reward.kwargs={tolerent: {tolerance: 0.5}, tests.plugins.exact: 3}"])
    assert problems == [
        "reward.kwargs.tolerent: with a list of functions, the keys of reward.kwargs name the functions (by name or "
        "path); 'tolerent' names none of them. Did you mean 'tolerant'?",
        "reward.kwargs.tests.plugins.exact: got 3; give the function's keyword arguments as a map, e.g. "
        "reward.kwargs.tests.plugins.exact={tolerance: 0.1}."]
    cfg = load_config("grpo", [fns, "reward.kwargs={tolerant: {tolerance: 0.5}}"])
    assert cfg.reward.kwargs_of("tests.plugins.tolerant") == {"tolerance": 0.5}
    assert cfg.reward.kwargs_of("tests.plugins.exact") == {}
