"""The user stages in examples/custom_advantage, used through the config like on the command line."""

import torch

from examples.custom_advantage.my_advantage import scale_outcome, token_gae_kl_outside

from .helpers import actor, batch, close, run

MOD = "examples.custom_advantage.my_advantage"


def test_scale_outcome_through_config():
    cfg = actor(advantage={"outcome_reward_shaping": {"implementation": f"{MOD}.scale_outcome",
                                                      "kwargs": {"factor": 0.5}}})
    out = run(batch([[0, 1, 1]], [3]), cfg)  # an integer reward is fine: the function returns floats
    close(out.outcome_rewards, [1.5])
    assert callable(scale_outcome)


def test_kl_outside_estimator_keeps_kl_out_of_returns():
    # Token GAE on the task reward 2 only (returns 2 everywhere), KL [0,-.2,-.4,0] added to the advantages.
    cfg = actor(kl_ctl=1.0, gae_lambda="areal_trainer.advantage.lambda_fn.constant_gae_lambda",
                gae_lambda_kwargs={"value": 1.0},
                advantage={"estimator": {"implementation": f"{MOD}.token_gae_kl_outside", "kwargs": {}}})
    data = batch([[0, 1, 1, 1, 1]], [2.0], logprobs=[[0, 0, 0.2, 0.4, 0]], ref_logp=torch.zeros(1, 5))
    out = run(data, cfg)
    close(out.returns, [[2, 2, 2, 2, 0]])
    close(out.advantages, [[2, 1.8, 1.6, 2, 0]])
    assert callable(token_gae_kl_outside)
