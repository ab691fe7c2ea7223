"""Approximations of the proximal policy's logprobs from policy versions (decoupled PPO).

Decoupled PPO (AReaL, arXiv:2505.24298) anchors the trust region at a proximal policy pi_prox,
normally the weights just before the update, obtained with an extra forward pass. Without that
pass, pi_prox is interpolated between the behaviour policy (version ``v_b`` of each token) and the
current policy (version ``v_theta``), with ``v_prox = v_theta - 1``:

``alpha = clamp((v_prox - v_b) / (v_theta - v_b), 0, 1)`` for generated tokens with ``v_theta > v_b``,
else 0, and

* ``loglinear``: ``log pi_prox = log pi_b + alpha (log pi_theta - log pi_b)``
* ``linear``:    ``log pi_prox = log((1 - alpha) pi_b + alpha pi_theta)``
* ``rollout``:   ``log pi_prox = log pi_b``.

Only ``loglinear`` is used for training; the others are reported by the ``metrics`` mode, which
trains on the recomputed pi_prox and measures how far each approximation is from it.
All tensors are ``[B, S]``; outputs are float32 and detached.
"""

from __future__ import annotations

import torch

from .stats import token_mean
from .types import Stats

PROX_LOGP_METHODS = ("recompute", "loglinear", "metrics")
"""How pi_prox is obtained: a forward pass (``recompute``), the ``loglinear`` approximation (no forward),
or a forward pass with every approximation's error reported (``metrics``)."""
PROX_APPROX_METHODS = ("loglinear", "linear", "rollout")
LINEAR_EPS = 1e-10
"""Added inside the log of the linear mixture so a zero probability stays finite."""
REL_ERR_EPS = 1e-8


def version_alpha(versions: torch.Tensor, current_version: int | torch.Tensor) -> torch.Tensor:
    """``[B, S]`` float32 interpolation weight of pi_theta in pi_prox.

    Args:
        versions: ``[B, S]`` integer behaviour version per token, -1 where nothing was generated.
        current_version: version of pi_theta (int or 0-dim tensor); pi_prox is one version older.
    """
    v_b = versions.float()
    gap = current_version - v_b  # v_theta - v_b
    usable = (v_b >= 0) & (gap > 0)
    # Where unusable the quotient is never selected; the clamp only keeps it finite.
    alpha = ((gap - 1.0) / gap.clamp_min(1.0)).clamp(0.0, 1.0)
    return torch.where(usable, alpha, 0.0)


def approximate_prox_logp(
    behav_logp: torch.Tensor, theta_logp: torch.Tensor, alpha: torch.Tensor, *, method: str = "loglinear"
) -> torch.Tensor:
    """``[B, S]`` float32 approximate log pi_prox (``theta_logp`` is detached: pi_prox is a constant)."""
    behav = behav_logp.detach().float()
    theta = theta_logp.detach().float()
    if method == "loglinear":
        return behav + alpha * (theta - behav)
    if method == "linear":
        return torch.log((1.0 - alpha) * torch.exp(behav) + alpha * torch.exp(theta) + LINEAR_EPS)
    if method == "rollout":
        return behav.clone()
    raise ValueError(f"prox approximation method must be one of {PROX_APPROX_METHODS}; got {method!r}.")


def prox_approx_metrics(
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    theta_logp: torch.Tensor,
    alpha: torch.Tensor,
    mask: torch.Tensor,
    count: torch.Tensor,
    *,
    prefix: str = "actor/prox_approx",
) -> Stats:
    """Errors of every approximation against the recomputed ``prox_logp``, as token means over ``mask``.

    Per method ``m``: ``{prefix}/{m}/abs_err`` ``|approx - gt|``, ``rel_err`` ``|approx - gt| / (|gt| + 1e-8)``,
    ``sq_err`` ``(approx - gt)^2`` and ``weight_abs_err``, the absolute error of the behaviour importance
    weight ``exp(prox - behav)`` it would induce. ``{prefix}/alpha`` is the mean interpolation weight.
    """
    gt = prox_logp.detach().float()
    behav = behav_logp.detach().float()
    gt_weight = torch.exp(gt - behav)
    stats = {f"{prefix}/alpha": token_mean(alpha, mask, count)}
    for method in PROX_APPROX_METHODS:
        approx = approximate_prox_logp(behav, theta_logp, alpha, method=method)
        err = approx - gt
        stats[f"{prefix}/{method}/abs_err"] = token_mean(err.abs(), mask, count)
        stats[f"{prefix}/{method}/rel_err"] = token_mean(err.abs() / (gt.abs() + REL_ERR_EPS), mask, count)
        stats[f"{prefix}/{method}/sq_err"] = token_mean(err.square(), mask, count)
        stats[f"{prefix}/{method}/weight_abs_err"] = token_mean((torch.exp(approx - behav) - gt_weight).abs(), mask,
                                                                count)
    return {k: v.detach() for k, v in stats.items()}
