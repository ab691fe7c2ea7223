"""KL estimators between two policies from the log-probabilities of sampled tokens.

With ``delta = logp - logp_base`` per token (samples drawn from ``logp``'s policy):

* ``k1 = delta``                      unbiased for KL(pi || base), can be negative;
* ``k2 = delta**2 / 2``               non-negative, low variance, biased;
* ``k3 = exp(-delta) - 1 + delta``    non-negative and unbiased (Schulman, "Approximating KL").

Reference: http://joschu.net/blog/kl-approx.html
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")

KL_CLAMP = 10.0
"""Reward-side KL values are clamped to [-10, 10] so one wild token cannot dominate a return."""


def kl_estimate(logp: torch.Tensor, logp_base: torch.Tensor, estimator: str, clamp: bool = True) -> torch.Tensor:
    """Per-token KL estimate, computed in float32.

    Args:
        logp: ``[...]`` log-probabilities of the sampled tokens under the sampling policy.
        logp_base: ``[...]`` the same tokens under the base (reference) policy.
        estimator: ``k1``, ``k2`` or ``k3``.
        clamp: clamp the result to ``[-KL_CLAMP, KL_CLAMP]``.

    Returns:
        ``[...]`` float32 tensor. Positions where both inputs are 0 (masked) give 0 for every estimator.
    """
    delta = logp.float() - logp_base.float()
    if estimator == "k1":
        kl = delta
    elif estimator == "k2":
        kl = 0.5 * delta.square()
    elif estimator == "k3":
        kl = torch.expm1(-delta) + delta
    else:
        raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}; got {estimator!r}")
    return kl.clamp(-KL_CLAMP, KL_CLAMP) if clamp else kl
