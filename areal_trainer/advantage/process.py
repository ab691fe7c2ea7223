"""Process (token-level) rewards: preparing ``data['token_rewards']`` and the built-in process stages.

Two modes (``actor.token_rewards_as_adv``):

* direct (true): the aligned rewards ``p`` stay out of GAE and the returns; after ``adv_norm`` the
  process stage combines them with the advantages (``additive``, ``gvpo``, ``process_weighted``).
* folded (false): each turn's (uniform) reward enters the GAE reward stream once, at the turn's last
  active position, so it reaches earlier tokens and the critic returns. The process stage then sees
  no token rewards and is the identity.

Process stages return advantages only; returns are never touched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .datatypes import ProcessAdvantageInputs

PROCESS_MODES = ("additive", "gvpo", "process_weighted")
GVPO_DEFAULTS = {"negative_scale": 0.2, "zero_penalty": 0.4, "zero_eps": 1e-6}


def split_token_rewards(
    token_rewards: torch.Tensor,
    *,
    loss_mask: torch.Tensor,
    mask: torch.Tensor,
    turn_ids: torch.Tensor | None,
    aligned_ids: torch.Tensor | None,
    truncated: torch.Tensor,
    zero_truncated: bool,
    as_advantage: bool,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(direct [B, S] or None, folded [B, S])`` from token-aligned ``token_rewards``.

    Args:
        token_rewards: ``[B, S]`` rollout process rewards (token-aligned, not rolled).
        loss_mask, turn_ids: the rollout's own (token-aligned) mask and turn ids (or None).
        mask, aligned_ids: their aligned versions (``mask`` float 0/1).
        truncated: ``[B]`` bool; with ``zero_truncated`` those rows get no process reward.
        as_advantage: direct mode if true, folded mode otherwise.
    """
    tr = token_rewards.float()
    if not as_advantage:
        _check_uniform_turns(tr, loss_mask.bool(), turn_ids)
    if zero_truncated:
        tr = torch.where(truncated[:, None], 0.0, tr)
    rolled = torch.roll(tr, -1, dims=-1) * mask
    if as_advantage:
        return rolled, torch.zeros_like(rolled)
    mask = mask.bool()
    nxt_active = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=-1)
    if aligned_ids is not None:
        same_turn = torch.cat([aligned_ids[:, 1:] == aligned_ids[:, :-1], torch.zeros_like(mask[:, :1])], dim=-1)
        nxt_active = nxt_active & same_turn
    turn_end = mask & ~nxt_active
    return None, torch.where(turn_end, rolled, 0.0)


def _check_uniform_turns(tr: torch.Tensor, raw_mask: torch.Tensor, raw_ids: torch.Tensor | None) -> None:
    pair = raw_mask[:, 1:] & raw_mask[:, :-1]
    if raw_ids is not None:
        pair = pair & (raw_ids[:, 1:] == raw_ids[:, :-1])
    if bool((pair & (tr[:, 1:] != tr[:, :-1])).any()):
        raise RuntimeError("token_rewards_as_adv=False requires uniform token rewards within each turn; a turn's "
                           "tokens carry different values. Give every token of a turn the turn's reward, or set "
                           "actor.token_rewards_as_adv=true.")


def check_process_mode(mode: str, cfg, *, source: str) -> None:
    """Call-time checks of a process mode (the config layer checks explicit stage selections)."""
    if mode not in PROCESS_MODES:
        raise ValueError(f"{source}: process advantage shaping mode must be one of {', '.join(PROCESS_MODES)}; "
                         f"got {mode!r}.")
    if mode in ("gvpo", "process_weighted") and not cfg.token_rewards_as_adv:
        raise ValueError(f"{source}: process shaping {mode!r} requires token_rewards_as_adv=True "
                         "(set actor.token_rewards_as_adv=true or use 'additive').")
    if mode == "process_weighted" and cfg.mask_no_eos_with_zero:
        raise ValueError(f"{source}: process shaping 'process_weighted' requires mask_no_eos_with_zero=False.")


def gvpo_params(legacy: Mapping[str, float] | None, explicit: Mapping[str, float] | None = None) -> dict[str, float]:
    """GVPO parameters: defaults, then the PRM (legacy) values, then explicit stage kwargs, key by key."""
    params = {**GVPO_DEFAULTS, **dict(legacy or {}), **dict(explicit or {})}
    for name, value in params.items():
        if name not in GVPO_DEFAULTS:
            raise ValueError(f"unknown GVPO parameter {name!r}; accepted: {', '.join(GVPO_DEFAULTS)}.")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"GVPO parameter {name} must be a finite number >= 0; got {value!r}.")
    return params


def additive(inputs: ProcessAdvantageInputs) -> torch.Tensor:
    """``A + p`` at active tokens."""
    if inputs.token_rewards is None:
        return inputs.advantages
    return inputs.advantages + torch.where(inputs.loss_mask.bool(), inputs.token_rewards, 0.0)


def gvpo(
    inputs: ProcessAdvantageInputs, *, negative_scale: float = 0.2, zero_penalty: float = 0.4, zero_eps: float = 1e-6
) -> torch.Tensor:
    """On tokens a PRM marks as failed (``p < 0``): a negative advantage is amplified by
    ``1 + negative_scale``, a near-zero one (``|A| <= zero_eps``) becomes ``-zero_penalty`` and a
    positive one becomes 0. Other tokens keep ``A``.
    """
    a, p = inputs.advantages, inputs.token_rewards
    if p is None:
        return a
    failed = (p < 0) & inputs.loss_mask.bool()
    shaped = torch.where(a < -zero_eps, a * (1 + negative_scale), torch.where(a > zero_eps, 0.0, -zero_penalty))
    return torch.where(failed, shaped, a)


def process_weighted(inputs: ProcessAdvantageInputs) -> torch.Tensor:
    """At active tokens with ``p`` in [0, 1]: ``A * p`` for ``A >= 0``; for ``A < 0``, ``p`` if ``p > 0``
    else ``A``. Inactive tokens are unchanged."""
    a, p = inputs.advantages, inputs.token_rewards
    if p is None:
        return a
    active = inputs.loss_mask.bool()
    if bool((active & ((p < 0) | (p > 1))).any()):
        raise RuntimeError("process_weighted requires process rewards in [0, 1] at active tokens.")
    shaped = torch.where(a >= 0, a * p, torch.where(p > 0, p, a))
    return torch.where(active, shaped, a)


PROCESS_FUNCTIONS = {"additive": additive, "gvpo": gvpo, "process_weighted": process_weighted}
