"""Per-token surrogate losses: PPO clipping, dual clipping and SAPO soft gates.

* PPO (arXiv:1707.06347): ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; an
  ``eps_high`` larger than ``eps_low`` is DAPO's clip-higher (arXiv:2503.14476).
* Dual clip (Ye et al., arXiv:1912.09729): for ``A < 0`` the loss is capped at ``c |A|`` so a huge
  ratio on a bad token cannot produce an unbounded update.
* SAPO (arXiv:2511.20347): a smooth gate ``g = (4 / tau) sigmoid(tau (r - 1))`` replaces the clip,
  ``l = -g A``, with ``tau_pos`` for ``A > 0`` and ``tau_neg`` otherwise. The ``4 / tau`` factor
  makes the gradient at ``r = 1`` equal to the plain policy gradient for every ``tau``.

Inputs are ``[B, S]`` tensors; outputs are per token and *not* masked (the caller masks).
"""

from __future__ import annotations

import torch


def clip_ratio(ratio: torch.Tensor, *, eps_low: float, eps_high: float) -> torch.Tensor:
    """``[B, S]`` ratio clamped to ``[1 - eps_low, 1 + eps_high]``."""
    return ratio.clamp(1.0 - eps_low, 1.0 + eps_high)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, *, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate loss per token.

    Returns:
        ``(loss, clipped_low, clipped_high)``: the ``[B, S]`` loss, and bool masks of the tokens where the
        clipped branch is active because the ratio is below ``1 - eps_low`` (negative advantage) or
        above ``1 + eps_high`` (positive advantage). Those tokens get no gradient.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * clip_ratio(ratio, eps_low=eps_low, eps_high=eps_high)
    loss = torch.maximum(unclipped, clipped)
    active = unclipped < clipped
    return loss, active & (ratio < 1.0 - eps_low), active & (ratio > 1.0 + eps_high)


def dual_clip(loss: torch.Tensor, advantages: torch.Tensor, *, c_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Cap the loss of negative-advantage tokens at ``c_clip * |A|``.

    Returns:
        ``(loss, dual_clipped)`` with ``dual_clipped`` the bool ``[B, S]`` mask of capped tokens.
        Positive advantages are untouched: their clipped loss is already <= 0 < c * A.
    """
    if not c_clip > 1.0:
        raise ValueError(f"c_clip must be > 1 for dual clipping; got {c_clip}.")
    cap = -c_clip * advantages
    capped = (advantages < 0) & (cap < loss)
    return torch.where(capped, cap, loss), capped


def sapo_gate(ratio: torch.Tensor, tau: float) -> torch.Tensor:
    """``(4 / tau) * sigmoid(tau * (ratio - 1))``; equals 2 at ratio 1 with slope 1."""
    if not tau > 0:
        raise ValueError(f"SAPO temperature must be positive; got {tau}.")
    return (4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0))


def sapo_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, *, tau_pos: float, tau_neg: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAPO soft-gated loss per token.

    Returns:
        ``(loss, gate, gate_pos, gate_neg)``, all ``[B, S]``: ``gate`` is the gate applied (``gate_pos``
        where ``A > 0``, else ``gate_neg``; ``A == 0`` takes the negative one), and ``gate_pos`` /
        ``gate_neg`` are both gates evaluated at every token, for monitoring.
    """
    gate_pos = sapo_gate(ratio, tau_pos)
    gate_neg = sapo_gate(ratio, tau_neg)
    gate = torch.where(advantages > 0, gate_pos, gate_neg)
    return -gate * advantages, gate, gate_pos, gate_neg
