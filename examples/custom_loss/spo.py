"""SPO's surrogate (Simple Policy Optimization, Xie et al., arXiv:2401.16025) as a policy-loss plugin.

Instead of clipping the ratio, SPO penalises its distance from 1 quadratically, so a token that
moved too far is pulled back rather than dropped from the gradient:

    l = -(r A - |A| / (2 eps) (r - 1)^2)

Its gradient vanishes at ``r = 1 + eps sign(A)`` (the edge of PPO's clip range) and points back
inside beyond it. Use it with

    python -m areal_trainer --config-name grpo actor.loss.surrogate.implementation=examples.custom_loss.spo.spo \\
        +actor.loss.surrogate.kwargs.epsilon=0.2
"""

from __future__ import annotations

from areal_trainer.loss import SurrogateInputs, SurrogateResult, token_mean


def spo(x: SurrogateInputs, *, epsilon: float = 0.2) -> SurrogateResult:
    """Per-token SPO loss; ``epsilon`` sets where the penalty cancels the advantage's pull."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0; got {epsilon}")
    a, r = x.advantages, x.ratio
    loss = -(r * a - a.abs() / (2 * epsilon) * (r - 1).square())
    beyond = ((r - 1) * a.sign() > epsilon).float()  # past the point where the pull turns back
    # a share of the step's loss tokens: over micro-batches, the mean weighted by their tokens
    return SurrogateResult(loss, {"actor/spo/beyond_frac": token_mean(beyond, x.mask, x.n_valid)})
