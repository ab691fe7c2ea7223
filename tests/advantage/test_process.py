"""Process rewards: direct and folded modes, GVPO and process-weighted shaping, mode checks."""

import pytest
import torch

from areal_trainer.advantage import ProcessAdvantageInputs
from areal_trainer.advantage.process import gvpo, gvpo_params, process_weighted

from .helpers import T, actor, batch, close, norm, run

# One row: prompt, turn 0 (2 tokens), a tool token, turn 1 (3 tokens); the PRM marks turn 1 with -.2.
# Aligned, positions 1, 2 (turn 0) and 4, 5, 6 (turn 1) are active; the outcome 1 sits at position 6.
LM = [[0, 0, 1, 1, 0, 1, 1, 1]]
IDS = [[-1, -1, 0, 0, -1, 1, 1, 1]]
TR = [[0, 0, 0, 0, 0, -0.2, -0.2, -0.2]]
ACTIVE = [1, 2, 4, 5, 6]


def _run(cfg, **inputs):
    return run(batch(LM, [1.0], turn_ids=IDS, token_rewards=TR, is_truncated=[False]), cfg, **inputs)


@pytest.mark.parametrize("unit", ["token", "turn"])
def test_direct_mode(unit):
    # gamma = lambda = 1, V = 0: the outcome 1 reaches every active token; p is added afterwards only.
    out = _run(actor(gae_timestep_unit=unit))
    close(out.advantages[0, ACTIVE], [1, 1, 0.8, 0.8, 0.8])
    close(out.returns[0, ACTIVE], [1, 1, 1, 1, 1])
    close(out.total_rewards[0, ACTIVE], [0, 0, 0, 0, 1])


@pytest.mark.parametrize("unit", ["token", "turn"])
def test_folded_mode(unit):
    # Turn 1's -.2 enters the reward stream once, at its last active position (6): 1 - .2 = .8 everywhere.
    out = _run(actor(gae_timestep_unit=unit, token_rewards_as_adv=False))
    close(out.advantages[0, ACTIVE], [0.8] * 5)
    close(out.returns[0, ACTIVE], [0.8] * 5)
    close(out.total_rewards[0, ACTIVE], [0, 0, 0, 0, 0.8])


def test_folded_mode_adjacent_turns():
    # loss_mask [0,1,1,1,1], ids [-1,0,0,1,1], rewards [0,.2,.2,s,s], outcome 0:
    # aligned ids [0,0,1,1,-1]; turn 0 ends at 1 (.2), turn 1 ends at 3 (s); returns sum what follows.
    s = 0.7
    out = run(batch([[0, 1, 1, 1, 1]], [0.0], turn_ids=[[-1, 0, 0, 1, 1]], token_rewards=[[0, 0.2, 0.2, s, s]]),
              actor(token_rewards_as_adv=False))
    close(out.total_rewards, [[0, 0.2, 0, s, 0]])
    close(out.returns[0, :4], [0.2 + s, 0.2 + s, s, s])


def test_folded_mode_requires_uniform_turns():
    with pytest.raises(RuntimeError, match="requires uniform token rewards within each turn"):
        run(batch(LM, [1.0], turn_ids=IDS, token_rewards=[[0, 0, 0, 0.1, 0, -0.2, -0.2, -0.2]]),
            actor(token_rewards_as_adv=False))


@pytest.mark.parametrize("as_adv", [True, False])
def test_truncated_rows_get_no_signal(as_adv):
    out = run(batch(LM, [1.0], turn_ids=IDS, token_rewards=TR, is_truncated=[True]),
              actor(mask_no_eos_with_zero=True, token_rewards_as_adv=as_adv))
    close(out.advantages[0, ACTIVE], [0] * 5)


def test_token_rewards_shape_check():
    with pytest.raises(ValueError, match="token_rewards must match the padded sequence shape"):
        run({**batch([[0, 1, 1]], [1.0]), "token_rewards": torch.zeros(1, 2)})


def _pin(a, p, mask):
    return ProcessAdvantageInputs(T([a]), T([p]), T([mask]).bool(), None)


def test_gvpo_truth_table():
    # failed = p < 0 and active: A < -eps -> A * 1.2; |A| <= eps -> -.4; A > eps -> 0; others keep A.
    pin = _pin([-2, -0.1, 0, 0.1, 2, 3, 4], [-1, -1, -1, -1, -1, 0, -1], [1, 1, 1, 1, 1, 1, 0])
    close(gvpo(pin, negative_scale=0.2, zero_penalty=0.4, zero_eps=0.1), [[-2.4, -0.4, -0.4, -0.4, 0, 3, 4]])


def test_process_weighted_truth_table():
    # A >= 0 -> A * p; A < 0 -> p if p > 0 else A; inactive unchanged.
    pin = _pin([-2, -1, 0, 2, 3, 4], [0, 0.25, 0.5, 0.25, 1, 2], [1, 1, 1, 1, 1, 0])
    close(process_weighted(pin), [[-2, 0.25, 0, 0.5, 3, 4]])


@pytest.mark.parametrize("bad", [-0.01, 1.01])
def test_process_weighted_range(bad):
    with pytest.raises(RuntimeError, match=r"process rewards in \[0, 1\]"):
        process_weighted(_pin([1.0], [bad], [1]))


def test_shaping_applies_to_normalized_advantages():
    # adv_norm with a batch mean only subtracts 1 (every advantage is 1): the failed turn's 0 becomes -.4.
    # Returns and total rewards are untouched, also with a dynamic lambda.
    cfg = actor(adv_norm=norm("batch", None), gae_lambda="areal_trainer.advantage.lambda_fn.constant_gae_lambda",
                gae_lambda_kwargs={"value": 1.0}, advantage={"process_adv_shaping": {"implementation": "gvpo"}})
    out = _run(cfg)
    close(out.advantages[0, ACTIVE], [0, 0, -0.4, -0.4, -0.4])
    close(out.returns[0, ACTIVE], [1] * 5)
    close(out.total_rewards[0, ACTIVE], [0, 0, 0, 0, 1])


def test_prm_mode_selects_builtin():
    out = _run(actor(adv_norm=norm("batch", None)), prm_mode="gvpo")
    close(out.advantages[0, ACTIVE], [0, 0, -0.4, -0.4, -0.4])


def test_prm_mode_checks_even_without_token_rewards():
    data = batch([[0, 1, 1]], [1.0])
    with pytest.raises(ValueError, match="requires token_rewards_as_adv=True"):
        run(data, actor(token_rewards_as_adv=False), prm_mode="gvpo")
    with pytest.raises(ValueError, match="requires mask_no_eos_with_zero=False"):
        run(data, actor(mask_no_eos_with_zero=True), prm_mode="process_weighted")
    with pytest.raises(ValueError, match="must be one of additive, gvpo, process_weighted"):
        run(data, actor(), prm_mode="multiply")


def test_missing_token_rewards_is_a_no_op():
    data = batch([[0, 1, 1]], [1.0])
    outs = [run(data, actor(), prm_mode=m).advantages for m in ("additive", "gvpo", "process_weighted")]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_gvpo_params_precedence():
    # explicit stage kwargs > legacy PRM values > defaults, key by key
    p = gvpo_params({"negative_scale": 0.5, "zero_penalty": 0.1}, {"zero_penalty": 0.7})
    assert p == {"negative_scale": 0.5, "zero_penalty": 0.7, "zero_eps": 1e-6}
    with pytest.raises(ValueError, match="finite number >= 0"):
        gvpo_params({"zero_eps": -1.0})
