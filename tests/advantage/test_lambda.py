"""Dynamic GAE lambda: the context, the built-in functions, resolution and return-value checks."""

import math

import pytest
import torch

from areal_trainer.advantage import GAELambdaContext, GAELambdaInputs, compute_gae_lambda
from areal_trainer.advantage.align import aligned_mask
from areal_trainer.advantage.gae import gae_lambda_context, token_level_gae
from areal_trainer.advantage.lambda_fn import (
    constant_gae_lambda,
    relative_position_gae_lambda,
    vapo_length_adaptive_gae,
)
from areal_trainer.errors import PluginOutputError

from .. import plugins as plug
from .helpers import T, actor, batch, close, run

RELPOS = "areal_trainer.advantage.lambda_fn.relative_position_gae_lambda"


def ctx_of(lengths):
    t = T(lengths, dtype=torch.float32)
    return GAELambdaContext(t, t, t)


def test_alias_and_dict_access():
    assert GAELambdaInputs is GAELambdaContext
    ctx = ctx_of([3.0])
    assert ctx["timestep_lengths"] is ctx.timestep_lengths


def test_effective_token_lengths_count_aligned_active_tokens():
    # loss_mask [0,1,1,1,0] rolls to [1,1,1,0,0]: 3 active tokens (the EOS included).
    m = aligned_mask(T([[0, 1, 1, 1, 0]]))
    ctx = gae_lambda_context(m, None, time_unit="token")
    close(ctx.effective_token_lengths, [3])
    close(ctx.turn_counts, [0])
    close(ctx.timestep_lengths, [3])


def test_turn_counts_skip_gaps():
    ctx = gae_lambda_context(T([[1, 1, 0, 1, 1]]).bool(), T([[0, 0, -1, 2, 2]]), time_unit="turn")
    close(ctx.turn_counts, [2])
    close(ctx.timestep_lengths, [2])
    close(ctx.effective_token_lengths, [4])


def test_turn_unit_without_ids_raises():
    with pytest.raises(ValueError, match="requires rollout data to include 'turn_ids'"):
        gae_lambda_context(torch.ones(1, 3, dtype=torch.bool), None, time_unit="turn")


def test_constant():
    close(constant_gae_lambda(ctx_of([0, 5]), value=0.7), [0.7, 0.7])


def test_vapo_values():
    # max(0, 1 - 1/(alpha * L)) with alpha 1: 4 -> .75, 2 -> .5, 1 -> 0; an empty row -> 0.
    close(vapo_length_adaptive_gae(ctx_of([4, 2, 1, 0]), alpha=1.0), [0.75, 0.5, 0, 0])


def test_vapo_in_turn_unit_counts_turns():
    # ids [0,0,-1,2,2] are 2 turns, so lambda = 1 - 1/2.
    lam = compute_gae_lambda(T([[1, 1, 0, 1, 1]]).bool(), T([[0, 0, -1, 2, 2]]), time_unit="turn",
                             gae_lambda=vapo_length_adaptive_gae, kwargs={"alpha": 1.0})
    close(lam, [0.5])


@pytest.mark.parametrize("alpha", [0, -1.0, True, math.nan, math.inf, "1"])
def test_vapo_rejects(alpha):
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        vapo_length_adaptive_gae(ctx_of([3]), alpha=alpha)


def test_relative_position_values():
    # q ** (1 / (L - 1)): L 2 -> q, L 3 -> sqrt(q); L 1 -> 1; L 0 -> 0.
    close(relative_position_gae_lambda(ctx_of([0, 1, 2, 3]), q=0.5), [0, 1, 0.5, math.sqrt(0.5)])


@pytest.mark.parametrize("q", [True, -0.1, 0, 1.1, math.nan, math.inf])
def test_relative_position_rejects(q):
    with pytest.raises(ValueError, match=r"q must be a finite number in \(0, 1\]"):
        relative_position_gae_lambda(ctx_of([3]), q=q)


def test_relative_position_keeps_equal_share_at_equal_relative_position():
    # With gamma 1 and a terminal reward, step k of L keeps lambda**(L - k) = q**((L - k)/(L - 1)):
    # step 5 of 10 and step 9 of 19 both keep q**(5/9).
    q = 0.3
    for length, step in ((10, 5), (19, 9)):
        m = torch.ones(1, length, dtype=torch.bool)
        lam = compute_gae_lambda(m, None, time_unit="token", gae_lambda=relative_position_gae_lambda, kwargs={"q": q})
        rewards = torch.zeros(1, length)
        rewards[0, -1] = 1.0
        adv, _ = token_level_gae(rewards, torch.zeros(1, length), m, torch.zeros(1), discount=1.0, gae_lambda=lam)
        assert adv[0, step - 1].item() == pytest.approx(q ** (5 / 9), rel=1e-5)
        assert adv[0, 0].item() == pytest.approx(q, rel=1e-5)
        assert adv[0, -1].item() == pytest.approx(1.0)


def test_relative_position_end_to_end_token_mode():
    # One prompt token + 10 response tokens, reward 1, V = 0, gamma 1, q = .3:
    # advantage at response step k is .3 ** ((10 - k) / 9); returns equal it; the last column is masked.
    cfg = actor(gae_lambda=RELPOS, gae_lambda_kwargs={"q": 0.3})
    out = run(batch([[0] + [1] * 10], [1.0]), cfg)
    expected = [0.3 ** ((10 - k) / 9) for k in range(1, 11)] + [0.0]
    close(out.advantages, [expected])
    close(out.returns, [expected])


def test_static_lambda_checks():
    m = torch.ones(1, 2, dtype=torch.bool)
    assert compute_gae_lambda(m, None, time_unit="token", gae_lambda=0.9) == 0.9
    with pytest.raises(TypeError):
        compute_gae_lambda(m, None, time_unit="token", gae_lambda=True)
    with pytest.raises(ValueError, match="Static gae_lambda must be finite"):
        compute_gae_lambda(m, None, time_unit="token", gae_lambda=math.nan)


def test_import_path_lambda():
    from areal_trainer.plugins import import_object

    lam = compute_gae_lambda(torch.ones(2, 3, dtype=torch.bool), None, time_unit="token",
                             gae_lambda=import_object(RELPOS, "actor.gae_lambda"), kwargs={"q": 0.25})
    close(lam, [0.5, 0.5])  # L = 3: .25 ** (1/2)


@pytest.mark.parametrize("ret,exc,message", [
    (lambda ctx: [0.5], TypeError, "must return a torch.Tensor"),
    (lambda ctx: torch.ones(3), ValueError, "one value per local trajectory"),
    (lambda ctx: torch.ones(2, dtype=torch.long), TypeError, "floating"),
    (lambda ctx: torch.tensor([0.5, math.nan]), RuntimeError, "non-finite"),
    (lambda ctx: torch.ones(2, device="meta"), ValueError, "on meta"),
])
def test_lambda_return_checks(ret, exc, message):
    with pytest.raises(exc, match=message) as info:
        compute_gae_lambda(torch.ones(2, 3, dtype=torch.bool), None, time_unit="token", gae_lambda=ret)
    assert isinstance(info.value, PluginOutputError)  # the command line shows it as one `Error:` line


@pytest.mark.parametrize("name,message", [("nan_lambda", "returned non-finite lambdas"),
                                          ("per_token_lambda", r"shape \(2,\); got \(7,\)")])
def test_a_bad_lambda_function_is_named_by_its_import_path(name, message):
    from areal_trainer.plugins import import_object

    fn = import_object(f"tests.plugins.{name}", "actor.gae_lambda")
    with pytest.raises(PluginOutputError, match=rf"^actor.gae_lambda \(tests.plugins.{name}\): .*{message}"):
        compute_gae_lambda(torch.ones(2, 3, dtype=torch.bool), None, time_unit="token", gae_lambda=fn)


def test_custom_lambda_sees_estimator_unit():
    # gae_timestep_unit says token, but the estimator override is turn_gae: the lambda gets turn lengths.
    cfg = actor(gae_lambda="tests.plugins.recording_lambda",
                advantage={"estimator": {"implementation": "turn_gae"}})
    data = batch([[0, 1, 1, 1, 1, 1]], [1.0], turn_ids=[[-1, 0, 0, 1, 1, 2]])
    run(data, cfg)
    ctx = plug.SEEN["lambda_ctx"]
    # aligned: mask [1,1,1,1,1,0], ids [0,0,1,1,2,-1] -> 5 tokens, 3 turns.
    close(ctx.effective_token_lengths, [5])
    close(ctx.turn_counts, [3])
    close(ctx.timestep_lengths, [3])
