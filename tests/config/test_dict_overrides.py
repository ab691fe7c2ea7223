"""Keys whose type is a dict take ``key={...}`` as users type it, and a value that is no mapping is one
problem naming the key, what was written and the form to write, reported with every other problem."""

import pytest

from areal_trainer.components import load_config
from areal_trainer.config import ConfigError
from areal_trainer.config.keys import index
from areal_trainer.config.loader import compose_dict, convert
from areal_trainer.config.overrides import dict_keys, normalize_overrides, split_overrides

from ..e2e.helpers import cli

FORM = "expected a mapping, written rollout.agent_kwargs='{name: value, ...}' (quoted for the shell, or quote the " \
       "whole override: 'rollout.agent_kwargs={name: value, ...}')."


def _composed(overrides):
    return convert(compose_dict("grpo", normalize_overrides(overrides)))


def test_the_dict_valued_keys_are_read_from_the_schema():
    keys = dict_keys()
    for key in ("rollout.agent_kwargs", "rollout.workflow_kwargs", "rollout.vllm_kwargs", "reward.kwargs",
                "scheduler.slurm_sbatch_args", "actor.gae_lambda_kwargs", "actor.loss.surrogate.kwargs",
                "teacher.teachers", "teacher.mopd.routes"):
        assert key in keys, key
    assert "reward.fn" not in keys and "actor.gae_lambda" not in keys  # free-form, but not typed as a dict
    assert all(index()[k].section is None for k in keys)


def test_key_equals_mapping_is_rewritten_to_merge_and_other_overrides_are_left_alone():
    assert normalize_overrides(["rollout.agent_kwargs={max_turns: 2}", "reward.kwargs.x=1", "seed=2",
                                "~reward.kwargs", "++reward.kwargs={a: 1}", "+reward.kwargs={a: 1}"]) == [
        "++rollout.agent_kwargs={max_turns: 2}", "reward.kwargs.x=1", "seed=2", "~reward.kwargs",
        "++reward.kwargs={a: 1}", "++reward.kwargs={a: 1}"]


def test_every_dict_valued_key_takes_a_mapping_as_users_type_it():
    cfg = _composed(["rollout.agent_kwargs={max_turns: 2}", "reward.kwargs={x: 1}", "rollout.workflow_kwargs={a: 1}",
                     "rollout.vllm_kwargs={b: 2}", "scheduler.slurm_sbatch_args={c: 3}",
                     "actor.gae_lambda_kwargs={q: 0.5}", "actor.advantage.estimator.kwargs={k: 1}"])
    assert cfg.rollout.agent_kwargs == {"max_turns": 2} and cfg.reward.kwargs == {"x": 1}
    assert cfg.rollout.workflow_kwargs == {"a": 1} and cfg.rollout.vllm_kwargs == {"b": 2}
    assert cfg.scheduler.slurm_sbatch_args == {"c": 3} and cfg.actor.gae_lambda_kwargs == {"q": 0.5}
    assert cfg.actor.advantage.estimator.kwargs == {"k": 1}  # inside a section that is null in the YAML


def test_typed_mappings_keep_their_types():
    cfg = _composed(["teacher.mopd.routes={a: {b: 1.0}}", "teacher.teachers={m: {path: builtin:tiny}}"])
    assert cfg.teacher.mopd.routes == {"a": {"b": 1.0}}
    assert cfg.teacher.teachers["m"].path == "builtin:tiny" and cfg.teacher.teachers["m"].weight == 1.0
    with pytest.raises(ConfigError, match=r"teacher.teachers=\{m: \{pathx: 1\}\}"):  # Hydra still checks the fields
        _composed(["teacher.teachers={m: {pathx: 1}}"])


def test_load_config_accepts_an_agent_with_its_kwargs_written_plainly():
    cfg = load_config("grpo", ["rollout.agent=tests.agents.simple.try_again", "rollout.agent_kwargs={max_turns: 3}"])
    assert cfg.rollout.agent_kwargs == {"max_turns": 3}


@pytest.mark.parametrize("arg, got", [
    ("rollout.agent_kwargs=3", "got 3"),
    ("rollout.agent_kwargs=[1,2]", "got [1, 2]"),
    ("rollout.agent_kwargs=foo:1", "got 'foo:1'"),
    ("rollout.agent_kwargs='{foo: 1}'", "got the quoted text '{foo: 1}', which Hydra reads as a string"),
    ('rollout.agent_kwargs="abc"', "got the quoted text 'abc', which Hydra reads as a string"),
    ("rollout.agent_kwargs={foo: 1", "got {foo: 1, which Hydra cannot parse (no viable alternative at input "
                                     "'{foo: 1')"),
    ("rollout.agent_kwargs={foo:", "got {foo:, which Hydra cannot parse"),  # the shell split it at the space
])
def test_a_value_that_is_no_mapping_names_the_key_the_value_and_the_form(arg, got):
    (problem,), usable = split_overrides(normalize_overrides([arg]))
    assert problem.startswith(f"rollout.agent_kwargs: {got}") and problem.endswith(FORM) and usable == []


def test_mapping_problems_are_reported_with_every_other_problem():
    with pytest.raises(ConfigError) as info:
        load_config("grpo", ["reward.kwargs=3", "rollout.workflow_kwargs={a: 1", "actor.eps_clp=0.3",
                             "gconfig.n_samples=1"])
    text = "\n".join(info.value.problems)
    assert "reward.kwargs: got 3; expected a mapping, written reward.kwargs='{name: value, ...}'" in text
    assert "rollout.workflow_kwargs: got {a: 1, which Hydra cannot parse" in text
    assert "actor.eps_clp: not a configuration key. Did you mean 'actor.eps_clip'?" in text
    assert "gconfig.n_samples=1 with actor.reward_norm.mean_level=group" in text


def test_cli_takes_a_mapping_as_typed_and_names_a_bad_one_without_a_traceback(tmp_path):
    proc = cli(["--config-name", "grpo", "rollout.agent=tests.agents.simple.try_again",
                "rollout.agent_kwargs={max_turns: 3}", "--cfg", "job"], cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "agent_kwargs:\n    max_turns: 3" in proc.stdout
    proc = cli(["--config-name", "grpo", "rollout.agent_kwargs=3", "reward.kwargs='{a: 1}'"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "2 configuration problems" in proc.stderr
    assert f"rollout.agent_kwargs: got 3; {FORM}" in proc.stderr
    assert "reward.kwargs: got the quoted text '{a: 1}', which Hydra reads as a string" in proc.stderr
