"""Per-token surrogate losses, the registered stage of the policy loss that turns importance ratios
and advantages into a loss per token.

* ``clip``, PPO (arXiv:1707.06347): ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; an
  ``eps_clip_higher`` larger than ``eps_clip`` is DAPO's clip-higher (arXiv:2503.14476); with
  ``c_clip`` the dual clip (Ye et al., arXiv:1912.09729) caps the loss of ``A < 0`` tokens at
  ``c |A|``, so a huge ratio on a bad token cannot produce an unbounded update.
* ``sapo``, SAPO (arXiv:2511.20347): a smooth gate ``g = (4 / tau) sigmoid(tau (r - 1))`` replaces
  the clip, ``l = -g A``, with ``tau_pos`` for ``A > 0`` and ``tau_neg`` otherwise. The ``4 / tau``
  factor makes the gradient at ``r = 1`` equal to the plain policy gradient for every ``tau``. Its
  ratio is taken against the behaviour policy, and it takes no behaviour weight (AReaL).

A surrogate is ``fn(SurrogateInputs, **settings) -> SurrogateResult``; its keyword arguments are
named like the ``actor`` keys they are read from (``eps_clip``, ``sapo_tau_pos``, ...), so binding
reads exactly those keys. :data:`SURROGATES` registers the built-ins with what they need of the
rest of the loss; its rules (``*_problems``) are checked by the config at start-up. Outputs are per
token and need not be masked (the policy loss masks them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import number_in
from .stats import token_mean
from .types import Stats


@dataclass(frozen=True)
class SurrogateInputs:
    """What a surrogate sees of one micro-batch (all ``[B, S]``).

    Attributes:
        ratio: importance ratio pi_theta / pi_base (token- or sequence-level), 0 outside ``mask``;
            differentiable through ``logprobs``.
        advantages: advantages matching the ratio's level (sequence means for GSPO), 0 outside ``mask``.
        logprobs: log pi_theta of the taken tokens, with gradient.
        mask: bool tokens in the loss (after the token filters).
        n_valid: 0-dim count of loss tokens before any filter (the denominator of the stats).
    """

    ratio: torch.Tensor
    advantages: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    n_valid: torch.Tensor


class SurrogateResult(NamedTuple):
    """``token_loss``: ``[B, S]`` per-token loss; ``stats``: 0-dim statistics, each a :class:`~.types.Stat` made
    with its reduction (e.g. ``token_mean(x, mask, n_valid)``) or a plain tensor (``stats.py::declared``)."""

    token_loss: torch.Tensor
    stats: Stats


@dataclass(frozen=True)
class Surrogate:
    """A registered surrogate.

    Attributes:
        fn: the surrogate function.
        base: ``proximal`` (the ratio is taken against pi_prox, which is pi_behav without the decoupled
            loss) or ``behavior``.
        behavior_weight: whether the decoupled loss's behaviour weight and rejection sampling apply.
        decoupled: whether it can be used with ``use_decoupled_loss=true``.
        problems: ``(key, **settings) -> list[str]``, its rules, checked by the config.
    """

    fn: Callable[..., SurrogateResult]
    base: str = "proximal"
    behavior_weight: bool = True
    decoupled: bool = True
    problems: Callable[..., list[str]] | None = None


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
    """Cap the loss of negative-advantage tokens at ``c_clip * |A|`` (``c_clip > 1``).

    Returns:
        ``(loss, dual_clipped)`` with ``dual_clipped`` the bool ``[B, S]`` mask of capped tokens.
        Positive advantages are untouched: their clipped loss is already <= 0 < c * A.
    """
    cap = -c_clip * advantages
    capped = (advantages < 0) & (cap < loss)
    return torch.where(capped, cap, loss), capped


def clip(x: SurrogateInputs, *, eps_clip: float, eps_clip_higher: float | None = None,
         c_clip: float | None = None) -> SurrogateResult:
    """The PPO clipped surrogate (asymmetric with ``eps_clip_higher``, dual-clipped with ``c_clip``)."""
    eps_high = eps_clip if eps_clip_higher is None else eps_clip_higher
    loss, low, high = clipped_surrogate(x.ratio, x.advantages, eps_low=eps_clip, eps_high=eps_high)
    stats = {"actor/clip_frac_low": token_mean(low.float(), x.mask, x.n_valid),
             "actor/clip_frac_high": token_mean(high.float(), x.mask, x.n_valid),
             "actor/clip_frac": token_mean((low | high).float(), x.mask, x.n_valid)}
    if c_clip is not None:
        loss, dual = dual_clip(loss, x.advantages, c_clip=c_clip)
        stats["actor/dual_clip_frac"] = token_mean(dual.float(), x.mask, x.n_valid)
    return SurrogateResult(loss, stats)


def clip_problems(key: str, *, eps_clip: float, eps_clip_higher: float | None = None,
                  c_clip: float | None = None) -> list[str]:
    return (number_in(f"{key}.eps_clip", eps_clip, 0) + number_in(f"{key}.eps_clip_higher", eps_clip_higher, 0,
                                                                     nullable=True)
            + number_in(f"{key}.c_clip", c_clip, 1, open_low=True, nullable=True,
                        note="the dual-clip constant, 3.0 is usual; null disables it"))


def sapo_gate(ratio: torch.Tensor, tau: float) -> torch.Tensor:
    """``(4 / tau) * sigmoid(tau * (ratio - 1))``; equals 2 at ratio 1 with slope 1 (``tau > 0``)."""
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


def sapo(x: SurrogateInputs, *, sapo_tau_pos: float, sapo_tau_neg: float) -> SurrogateResult:
    """SAPO's soft-gated surrogate."""
    loss, gate, gate_pos, gate_neg = sapo_surrogate(x.ratio, x.advantages, tau_pos=sapo_tau_pos, tau_neg=sapo_tau_neg)
    return SurrogateResult(loss, {"actor/sapo/gate": token_mean(gate, x.mask, x.n_valid),
                                  "actor/sapo/gate_pos": token_mean(gate_pos, x.mask, x.n_valid),
                                  "actor/sapo/gate_neg": token_mean(gate_neg, x.mask, x.n_valid)})


def sapo_problems(key: str, *, sapo_tau_pos: float, sapo_tau_neg: float) -> list[str]:
    return [x for name, v in (("sapo_tau_pos", sapo_tau_pos), ("sapo_tau_neg", sapo_tau_neg))
            for x in number_in(f"{key}.{name}", v, 0, open_low=True, note="a SAPO gate temperature")]


def cispo(x: SurrogateInputs, *, eps_clip: float, eps_clip_higher: float | None = None) -> SurrogateResult:
    """CISPO, MiniMax-M1 (arXiv:2506.13585): ``l = -sg(clip(r, 1 - eps_clip, 1 + eps_clip_higher)) A log pi``.
    The ratio is clipped as a stop-gradient weight of a REINFORCE term instead of clipping the update,
    so every token keeps its gradient (PPO drops the clipped ones)."""
    eps_high = eps_clip if eps_clip_higher is None else eps_clip_higher
    weight = clip_ratio(x.ratio.detach(), eps_low=eps_clip, eps_high=eps_high)
    clipped = (weight != x.ratio.detach()).float()
    return SurrogateResult(-weight * x.advantages * x.logprobs,
                           {"actor/cispo/weight": token_mean(weight, x.mask, x.n_valid),
                            "actor/cispo/clip_frac": token_mean(clipped, x.mask, x.n_valid)})


SURROGATES = {
    "clip": Surrogate(clip, problems=clip_problems),
    "sapo": Surrogate(sapo, base="behavior", behavior_weight=False, decoupled=False, problems=sapo_problems),
    "cispo": Surrogate(cispo, problems=clip_problems),
}
"""The built-in surrogates, by the name ``actor.loss.surrogate.implementation`` takes."""
