"""The policy loss's seams: a surrogate or the whole loss given by import path, bound and checked at
start-up, their outputs checked at every call; and the log-ratio bound that keeps one extreme
token from turning a step into NaN."""

import math

import pytest
import torch

from areal_trainer.components.loss import bind_policy_loss
from areal_trainer.errors import ConfigError, PluginOutputError, UserError
from areal_trainer.loss import PolicyLoss, Reduction, reduce_stats
from areal_trainer.loss.ratio import LOG_RATIO_BOUND

from .helpers import actor_config, inputs, loss_fn, t


def surrogate(impl, **kwargs):
    return actor_config(loss={"surrogate": {"implementation": impl, "kwargs": kwargs}})


def test_a_user_surrogate_replaces_the_clip_and_gets_its_kwargs():
    fn = bind_policy_loss(surrogate("tests.plugins.reinforce", scale=2.0))
    # r = e^{0.5}, A = 1: loss -2 e^{0.5} (no clip at eps 0.2 would have capped it at -1.2 * 2 / 2).
    res = fn(inputs(t([[0.5]]), t([[1.0]]), [[1]], prox=t([[0.0]])))
    assert res.loss.item() == pytest.approx(-2 * math.exp(0.5), rel=1e-6)
    assert res.stats["actor/reinforce/scale"].item() == 2.0
    assert "actor/clip_frac" not in res.stats


def test_a_plugin_declares_how_its_statistics_combine_and_plain_tensors_get_the_default():
    fn = bind_policy_loss(surrogate("tests.plugins.declared_reinforce"))
    # Micro-batch 0: ratios e^0.5, e^0 (A = +1, -1); micro-batch 1: one ratio e^1 (A = +1).
    first = fn(inputs(t([[0.5, 0.0]]), t([[1.0, -1.0]]), [[1, 1]], prox=t([[0.0, 0.0]]))).stats
    second = fn(inputs(t([[1.0]]), t([[1.0]]), [[1]], prox=t([[0.0]]))).stats
    step = reduce_stats([first, second])
    assert step["actor/declared/largest_ratio"].item() == pytest.approx(math.e)  # Stat.max: the largest
    assert step["actor/declared/positive"].item() == 2.0  # Stat.sum: 1 + 1
    assert step["actor/declared/ratio_mean"].item() == pytest.approx(((math.exp(0.5) + 1) / 2 + math.e) / 2)  # plain
    assert step["actor/importance_ratio/mean"].item() == pytest.approx((math.exp(0.5) + 1 + math.e) / 3)  # by tokens
    plain = bind_policy_loss(surrogate("tests.plugins.reinforce", scale=2.0))
    stats = plain(inputs(t([[0.5, 0.0]]), t([[1.0, -1.0]]), [[1, 1]], prox=t([[0.0, 0.0]]))).stats
    made = stats["actor/reinforce/scale"]  # a plain tensor: the mean weighted by actor/n_valid_tokens
    assert made.reduction is Reduction.MEAN and made.weight.item() == 2.0


def test_a_statistic_declared_wrongly_stops_naming_the_function():
    fn = bind_policy_loss(surrogate("tests.plugins.max_with_a_weight"))
    with pytest.raises(PluginOutputError, match=r"actor.loss.surrogate \(tests.plugins.max_with_a_weight\): "
                                                r"stats\['actor/bad'\] is a Stat whose value \(or weight\)"):
        fn(inputs(t([[0.5]]), t([[1.0]]), [[1]]))


def test_a_whole_loss_plugin_replaces_the_staged_loss():
    fn = bind_policy_loss(actor_config(loss={"compute": {"implementation": "tests.plugins.whole_loss",
                                                         "kwargs": {"weight": 3.0}}}))
    inp = inputs(t([[0.5, -0.2]]), t([[1.0, -1.0]]), [[1, 1]], prox=t([[0.0, 0.0]]))
    assert fn(inp).loss.item() == pytest.approx(3 * PolicyLoss()(inp).loss.item(), rel=1e-6)


@pytest.mark.parametrize("impl,match", [
    ("tests.plugins.wrong_shape", r"token_loss has shape \(1,\); expected \(1, 2\)"),
    ("tests.plugins.nan_loss", "token_loss has NaN or inf on loss tokens"),
])
def test_a_bad_surrogate_output_stops_naming_the_function(impl, match):
    fn = bind_policy_loss(surrogate(impl))
    with pytest.raises(UserError, match=rf"actor.loss.surrogate \({impl}\): {match}"):
        fn(inputs(t([[0.5, 0.1]]), t([[1.0, 1.0]]), [[1, 1]]))


def test_a_bad_whole_loss_output_stops_naming_the_function():
    fn = bind_policy_loss(actor_config(loss={"compute": {"implementation": "tests.plugins.vector_loss"}}))
    with pytest.raises(UserError, match=r"actor.loss.compute.implementation \(tests.plugins.vector_loss\): "
                                        r"the loss must be a 0-dim float tensor"):
        fn(inputs(t([[0.5, 0.1]]), t([[1.0, 1.0]]), [[1, 1]]))


def test_binding_problems_are_reported_together_naming_the_keys():
    cfg = actor_config(validate=False, use_sapo_loss=True,
                       loss={"surrogate": {"implementation": "tests.plugins.missing", "kwargs": {"nope": 1}}})
    with pytest.raises(ConfigError) as info:
        bind_policy_loss(cfg)
    msg = str(info.value)
    assert "actor.use_sapo_loss=true conflicts with actor.loss.surrogate.implementation='tests.plugins.missing'" in msg
    assert "actor.loss.surrogate.implementation: module 'tests.plugins' has no attribute 'missing'" in msg
    with pytest.raises(ConfigError, match=r"kwargs \{'scale': 2\.0\} do not fit no_kwargs"):
        bind_policy_loss(surrogate("tests.plugins.no_kwargs", scale=2.0))
    with pytest.raises(ConfigError, match="the built-in 'clip' reads its settings from actor.eps_clip, "
                                          "actor.eps_clip_higher, actor.c_clip"):
        bind_policy_loss(surrogate("clip", eps_clip=0.1))
    with pytest.raises(ConfigError, match="replaces the whole policy loss and cannot be combined"):
        bind_policy_loss(actor_config(loss={"compute": {"implementation": "tests.plugins.whole_loss"},
                                            "surrogate": {"implementation": "clip"}}))


def test_an_unknown_builtin_surrogate_suggests_the_closest():
    with pytest.raises(ValueError, match="must be one of 'auto', 'clip', 'sapo'.* Did you mean 'clip'"):
        actor_config(loss={"surrogate": {"implementation": "clp"}})


@pytest.mark.parametrize("kwargs", [{}, {"use_sapo_loss": True}, {"importance_sampling_level": "sequence"},
                                    {"c_clip": 3.0}])
def test_an_extreme_log_ratio_gives_a_finite_loss_and_gradient(kwargs):
    # One token moved by 200 nats against a negative advantage: exp(200) overflows float32.
    fn = loss_fn(**kwargs)
    inp = inputs(t([[200.0, 0.1]]), t([[-1.0, 1.0]]), [[1, 1]], prox=t([[0.0, 0.0]]))
    res = fn(inp)
    res.loss.backward()
    assert torch.isfinite(res.loss) and torch.isfinite(inp.logprobs.grad).all()
    assert res.stats["actor/importance_ratio/max"].item() <= math.exp(LOG_RATIO_BOUND) * (1 + 1e-6)


def test_the_spo_example_hand_derived():
    # r = 1.5, A = +1, eps 0.2: l = -(1.5 - 1/0.4 * 0.25) = -0.875; dl/dr = -(1 - (1/0.2) * 0.5) = 1.5,
    # dl/dlogp = r * dl/dr = 2.25 (pulled back: the ratio is past 1 + eps).
    fn = bind_policy_loss(surrogate("examples.custom_loss.spo.spo", epsilon=0.2))
    inp = inputs(t([[math.log(1.5)]]), t([[1.0]]), [[1]], prox=t([[0.0]]))
    res = fn(inp)
    res.loss.backward()
    assert res.loss.item() == pytest.approx(-0.875, rel=1e-6)
    assert inp.logprobs.grad.item() == pytest.approx(2.25, rel=1e-5)
    assert res.stats["actor/spo/beyond_frac"].item() == 1.0


# -- a loss without a gradient ---------------------------------------------------------------------

@pytest.mark.parametrize("impl,label,what", [
    ("tests.plugins.detached_loss", "actor.loss.compute.implementation", "the loss has no gradient "
                                                                         r"\(requires_grad=False, grad_fn=None\)"),
    ("tests.plugins.leaf_loss", "actor.loss.compute.implementation", "the loss has no gradient "
                                                                     r"\(requires_grad=True, grad_fn=None\)"),
    ("tests.plugins.detached_surrogate", "actor.loss.surrogate", "the token_loss has no gradient"),
])
def test_a_loss_without_gradient_stops_naming_the_function(impl, label, what):
    section = "surrogate" if label.endswith("surrogate") else "compute"
    fn = bind_policy_loss(actor_config(loss={section: {"implementation": impl}}))
    inp = inputs(t([[0.5, 0.1]]), t([[1.0, 1.0]]), [[1, 1]], prox=t([[0.0, 0.0]]))
    assert inp.logprobs.requires_grad
    with pytest.raises(PluginOutputError, match=rf"^{label} \({impl}\): {what}") as info:
        fn(inp)
    # The command line shows a UserError as one line; code that caught the old classes still does.
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)


def test_the_gradient_check_applies_only_where_there_is_a_gradient_to_reach():
    # No gradient on the inputs, or none asked for (torch.no_grad): the same plugins compute their loss.
    for section, impl in (("compute", "tests.plugins.detached_loss"),
                          ("surrogate", "tests.plugins.detached_surrogate")):
        fn = bind_policy_loss(actor_config(loss={section: {"implementation": impl}}))
        inp = inputs(t([[0.5, 0.1]]), t([[1.0, 1.0]]), [[1, 1]], prox=t([[0.0, 0.0]]))
        with torch.no_grad():
            assert torch.isfinite(fn(inp).loss)
        inp = inputs(t([[0.5, 0.1]]), t([[1.0, 1.0]]), [[1, 1]], prox=t([[0.0, 0.0]]), requires_grad=False)
        assert torch.isfinite(fn(inp).loss)


def test_bad_loss_outputs_are_plugin_output_errors():
    fn = bind_policy_loss(actor_config(loss={"compute": {"implementation": "tests.plugins.vector_loss"}}))
    with pytest.raises(PluginOutputError):
        fn(inputs(t([[0.5, 0.1]]), t([[1.0, 1.0]]), [[1, 1]]))
    fn = bind_policy_loss(surrogate("tests.plugins.nan_loss"))
    with pytest.raises(PluginOutputError):
        fn(inputs(t([[0.5, 0.1]]), t([[1.0, 1.0]]), [[1, 1]]))
