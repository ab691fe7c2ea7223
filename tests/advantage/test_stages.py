"""The staged API: binding at start-up, its errors, user stages, the full replacement, output checks."""

import pytest
import torch

from areal_trainer.advantage import AdvantageInputs
from areal_trainer.components.advantage import bind_advantage
from areal_trainer.errors import PluginOutputError

from . import helpers
from .helpers import actor, batch, close, norm, run

P = "tests.plugins"
DATA = batch([[0, 1, 1, 0], [0, 1, 1, 1]], [1.0, 2.0], attention_mask=[[1, 1, 1, 0], [1, 1, 1, 1]])


def stage(impl, **kwargs):
    return {"implementation": impl, "kwargs": kwargs}


def problems_of(**cfg_kw):
    """The start-up problems of a run whose actor config has ``cfg_kw``."""
    return helpers.problems_of(actor(**cfg_kw))


def test_scale_outcome_plugin():
    cfg = actor(advantage={"outcome_reward_shaping": stage(f"{P}.scale_outcome", factor=0.5)})
    out = run(DATA, cfg)
    close(out.outcome_rewards, [0.5, 1.0])
    close(out.advantages, [[0.5, 0.5, 0, 0], [1, 1, 1, 0]])


def test_full_replacement():
    cfg = actor(advantage={"compute": stage(f"{P}.constant_advantages", value=3.0)})
    out = run(DATA, cfg)
    assert torch.equal(out.advantages, torch.full((2, 4), 3.0))


def test_builtin_names_and_auto():
    for impl in ("identity", "auto"):
        run(DATA, actor(advantage={"outcome_reward_shaping": stage(impl)}))
    out = run(DATA, actor(advantage={"process_adv_shaping": stage("additive"), "estimator": stage("token_gae")}))
    close(out.advantages, [[1, 1, 0, 0], [2, 2, 2, 0]])


@pytest.mark.parametrize("path,message", [
    (f"{P}_missing.fn", "not found"),
    ("tests.plugins_broken.fn", "raised RuntimeError: boom while importing"),
    (f"{P}.no_such_function", "has no attribute 'no_such_function'"),
    (f"{P}.NOT_CALLABLE", "is a int, not a callable"),
])
def test_plugin_errors(path, message):
    problems = problems_of(advantage={"estimator": stage(path)})
    assert len(problems) == 1
    assert problems[0].startswith("actor.advantage.estimator.implementation: ")
    assert message in problems[0]


def test_plugin_kwargs_must_fit():
    problems = problems_of(advantage={"outcome_reward_shaping": stage(f"{P}.scale_outcome", scale=2)})
    assert "do not fit" in problems[0] and "Accepted keyword arguments: factor" in problems[0]
    problems = problems_of(advantage={"estimator": stage("token_gae", foo=1)})
    assert problems[0].startswith("actor.advantage.estimator.kwargs") and "do not fit" in problems[0]


def test_all_problems_are_collected():
    problems = problems_of(
        advantage={"outcome_reward_shaping": stage(f"{P}_missing.fn"), "estimator": stage(f"{P}.NOT_CALLABLE"),
                   "process_adv_shaping": stage("gvpo_typo")},
        gae_lambda="areal_trainer.advantage.lambda_fn.vapo_length_adaptive_gae", gae_lambda_kwargs={"alpha": -1})
    keys = [p.split(":")[0] for p in problems]
    assert keys == ["actor.gae_lambda_kwargs", "actor.advantage.outcome_reward_shaping.implementation",
                    "actor.advantage.estimator.implementation", "actor.advantage.process_adv_shaping.implementation"]
    assert "Did you mean 'gvpo'?" in problems[3]
    assert "alpha must be a positive number" in problems[0]


def test_config_rules():
    p = problems_of(advantage={"compute": stage("default", scale=1)})
    assert any("default compute takes no kwargs" in x for x in p)
    p = problems_of(advantage={"compute": stage(f"{P}.constant_advantages"), "estimator": stage("turn_gae")})
    assert any("cannot be combined with stage entries (estimator)" in x for x in p)
    p = problems_of(advantage={"process_adv_shaping": stage("auto", zero_penalty=0.1)})
    assert any("implementation 'auto' takes no kwargs" in x for x in p)
    p = problems_of(advantage={"process_adv_shaping": stage("gvpo")}, token_rewards_as_adv=False)
    assert any("requires actor.token_rewards_as_adv=true" in x for x in p)
    p = problems_of(advantage={"outcome_reward_shaping": stage(f"{P}.scale_outcome", factor={1, 2})})
    assert any("JSON-serialisable" in x for x in p)


def test_lambda_path_errors_name_the_key():
    p = problems_of(gae_lambda=f"{P}.no_such_lambda")
    assert p[0].startswith("actor.gae_lambda: ") and "has no attribute" in p[0]


# -- process precedence --------------------------------------------------------------------------

LM = [[0, 1, 1, 1]]
TR = [[0, -1.0, -1.0, 0]]  # aligned: the first two active tokens failed (p < 0)


def _process_run(cfg, **inputs):
    return run(batch(LM, [0.0], token_rewards=TR, is_truncated=[False]), cfg, **inputs)


def test_explicit_process_beats_prm_mode():
    # additive: A + p = 0 - 1; the PRM's gvpo would have given -zero_penalty instead.
    out = _process_run(actor(advantage={"process_adv_shaping": stage("additive")}), prm_mode="gvpo")
    close(out.advantages, [[-1, -1, 0, 0]])
    out = _process_run(actor(), prm_mode="gvpo")
    close(out.advantages, [[-0.4, -0.4, 0, 0]])


def test_gvpo_kwargs_override_legacy_key_by_key():
    # Advantages are 0 (reward 0), so a failed token gets -zero_penalty: the explicit .7 wins over the
    # legacy .1; zero_eps keeps its legacy value 1.0, so the tokens count as "zero" either way.
    cfg = actor(advantage={"process_adv_shaping": stage("gvpo", zero_penalty=0.7)})
    out = _process_run(cfg, prm_mode="additive", prm_params={"zero_penalty": 0.1, "zero_eps": 1.0})
    close(out.advantages, [[-0.7, -0.7, 0, 0]])


def test_custom_process_stage_never_touches_returns():
    cfg = actor(advantage={"process_adv_shaping": stage(f"{P}.zero_process", value=5.0)})
    out = _process_run(cfg)
    close(out.advantages, [[5, 5, 5, 0]])
    close(out.returns[:, :3], [[0, 0, 0]])


# -- output validation ---------------------------------------------------------------------------

@pytest.mark.parametrize("stage_name,impl,message", [
    ("outcome_reward_shaping", "wrong_shape_outcome", "OutcomeResult.rewards must have shape (2,)"),
    ("outcome_reward_shaping", "nan_outcome", "OutcomeResult.rewards contains NaN or inf"),
    ("outcome_reward_shaping", "int_outcome", "OutcomeResult.rewards must be a floating-point tensor"),
    ("outcome_reward_shaping", "tuple_outcome", "must return an OutcomeResult"),
    ("outcome_reward_shaping", "mutating_outcome", "modified the input tensor(s) 'loss_mask' in place"),
    ("estimator", "nan_estimator", "TemporalResult.advantages contains NaN or inf"),
    ("process_adv_shaping", "short_process", "advantages must have shape (2, 4)"),
    ("compute", "non_binary_mask", "AdvantageResult.loss_mask must be binary"),
    ("compute", "inf_returns", "AdvantageResult.returns contains NaN or inf"),
    ("compute", "overwriting_extras", "extras may only hold"),
    ("compute", "mutating_replacement", "modified the input tensor(s) 'rewards' in place"),
])
def test_output_validation_names_plugin_and_field(stage_name, impl, message):
    cfg = actor(advantage={stage_name: stage(f"{P}.{impl}")})
    with pytest.raises((ValueError, TypeError)) as e:
        run({k: v.clone() for k, v in DATA.items()}, cfg)
    text = str(e.value)
    assert text.startswith(f"actor.advantage.{stage_name} ({P}.{impl}): "), text
    assert message in text, text
    assert isinstance(e.value, PluginOutputError)  # the command line shows it as one `Error:` line


def test_identity_keeps_integer_rewards():
    data = batch([[0, 1, 1]], torch.tensor([2], dtype=torch.int32))
    from areal_trainer.advantage import OutcomeRewardInputs
    from areal_trainer.advantage.reward import identity

    res = identity(OutcomeRewardInputs(data=data, config=actor(), meta=None))
    assert res.rewards.dtype == torch.int32
    close(run(data).outcome_rewards, [2.0])


def test_explicit_references_required_from_custom_shaping():
    from areal_trainer.advantage import RolloutGroup, TrajBatchMeta

    meta = TrajBatchMeta(traj_group_sizes=(2,), rollout_groups=(RolloutGroup((1, 1), (1.0, None)),))
    cfg = actor(reward_norm=norm("group", "group"),
                advantage={"outcome_reward_shaping": stage(f"{P}.scale_outcome", factor=2.0)})
    with pytest.raises(PluginOutputError, match="must return OutcomeResult.normalization_rewards"):
        run(DATA, cfg, meta=meta)
    cfg = actor(reward_norm=norm("group", "group"), max_new_tokens=4,
                advantage={"outcome_reward_shaping": stage("examples.custom_advantage.my_advantage.length_penalty",
                                                           coef=1.0)})
    out = run(DATA, cfg, meta=meta)
    # references [0.5, 1.25]: explicit 1 and row 2, less length/4
    close(out.outcome_rewards, [-0.7071, 0.7071], atol=1e-4)


def test_resolution_happens_once():
    cfg = actor(advantage={"outcome_reward_shaping": stage(f"{P}.scale_outcome", factor=1.0)})
    fn = bind_advantage(cfg)
    assert fn.stages.outcome.builtin is False and fn.stages.process is None
    out = fn(AdvantageInputs(DATA, cfg))
    close(out.outcome_rewards, [1, 2])
