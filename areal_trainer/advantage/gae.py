"""Generalised advantage estimation over tokens or turns, and the per-row GAE lambda.

All inputs are next-token aligned (see :mod:`areal_trainer.advantage.datatypes`). Masked positions
consume no discount: the recurrence runs over the active steps of each row only,

    delta_u = r_u + gamma * V_{u+1} - V_u,    A_u = delta_u + gamma * lambda_b * A_{u+1},

where ``V_{u+1}`` is the value of the next active step, or the row's bootstrap value after its last
one (0 unless the row was truncated). A step is one active token (token mode) or one non-empty
turn (turn mode: its rewards summed, its value taken at its first active token). Advantages are 0
at masked positions and returns there are the values themselves.

Token steps with a static lambda in ``[0.5, 1]`` and ``gamma * lambda >= 0.1`` (the usual settings) run
in place, with no compaction: ``delta`` needs the next step's value, but summed over the steps,

    A_u = sum_k c**k (r + (1/lambda - 1) V)_{u_k} + c**K gamma V_boot - V_u / lambda,    c = gamma * lambda,

over the row's active steps ``u_0 = u, u_1, ...`` and ``K`` of them after ``u`` (the ``gamma V_{u_k+1}`` terms
of ``delta`` are ``(1/lambda) c V_{u_{k+1}}``), a discounted sum over the
active positions that :func:`areal_trainer.advantage.scan.stepwise_discounted_cumsum` computes without
moving them. Lambda at least 0.5 bounds the cancellation in ``- V_u / lambda`` to a factor 2.

Other token settings compact each row's steps to the front (a scatter), run the recurrence with
:func:`areal_trainer.advantage.scan.reverse_discounted_cumsum`, and gather the result back.

Turns are few, so their recurrence runs on ``[B, max id + 1]`` arrays, one column per turn id, and
never scatters over the sequence (CPU scatters that add into few columns wait on each other's
stores): the running maximum of the ids (which validation computes anyway) is sorted, so a binary
search finds each turn's first token; a turn's reward sum is the difference of one cumulative sum
read before its first token and before the next turn's; ids no active token carries are compacted
away before the recurrence. Every token then reads its id's column (one int32 flat index for
both outputs).

Each kernel makes one host synchronisation per call, which trims the work: the longest row's steps, or,
for turns, the validation's, which also brings back the largest turn id.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import PluginOutputError
from .scan import MIN_STEP_COEF, reverse_discounted_cumsum, stepwise_discounted_cumsum
from .turns import MISSING_TURN_IDS, TurnSlots, as_float_mask, validated_turn_slots, validated_turn_starts

TIME_UNITS = ("token", "turn")


@dataclass(frozen=True)
class GAELambdaContext:
    """What a lambda function sees: three ``[B]`` float32 tensors (also readable as ``ctx["name"]``).

    Attributes:
        effective_token_lengths: active (trained) tokens per row, an active EOS included.
        turn_counts: non-empty turns per row (0 in token mode without ``turn_ids``).
        timestep_lengths: the GAE steps per row in the estimator's unit (tokens or turns).
    """

    effective_token_lengths: torch.Tensor
    turn_counts: torch.Tensor
    timestep_lengths: torch.Tensor

    def __getitem__(self, key: str) -> torch.Tensor:
        return getattr(self, key)


GAELambdaInputs = GAELambdaContext


def gae_lambda_context(loss_mask: torch.Tensor, turn_ids: torch.Tensor | None, *, time_unit: str) -> GAELambdaContext:
    """Lengths of every row in tokens and turns, and in ``time_unit`` (``token`` or ``turn``)."""
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be 'token' or 'turn'; got {time_unit!r}.")
    m = as_float_mask(loss_mask)
    tokens = m.sum(-1)
    if turn_ids is None:
        if time_unit == "turn":
            raise ValueError(MISSING_TURN_IDS)
        turns = torch.zeros_like(tokens)
    else:
        turns = validated_turn_starts(turn_ids, m).sum(-1)
    return GAELambdaContext(tokens, turns, tokens if time_unit == "token" else turns)


def compute_gae_lambda(
    loss_mask: torch.Tensor,
    turn_ids: torch.Tensor | None,
    *,
    time_unit: str,
    gae_lambda: float | Callable[..., torch.Tensor],
    kwargs: Mapping[str, Any] | None = None,
) -> float | torch.Tensor:
    """Resolve ``gae_lambda`` for a batch: a static float, or a function of a ``GAELambdaContext``.

    Args:
        loss_mask: ``[B, S]`` aligned mask.
        turn_ids: ``[B, S]`` aligned turn ids, or None.
        time_unit: the unit of the estimator that will use the lambda (``token`` or ``turn``).
        gae_lambda: a number, or a callable ``fn(ctx, **kwargs) -> [B]``.
        kwargs: keyword arguments of the callable.

    Returns:
        A float, or a ``[B]`` float32 tensor (one lambda per row, detached).
    """
    if isinstance(gae_lambda, bool):
        raise TypeError(f"gae_lambda must be a number or a function, not a bool ({gae_lambda}).")
    if isinstance(gae_lambda, (int, float)):
        if not math.isfinite(gae_lambda):
            raise ValueError(f"Static gae_lambda must be finite; got {gae_lambda}.")
        return float(gae_lambda)
    fn = gae_lambda
    if not callable(fn):
        raise TypeError(f"gae_lambda must be a number or a callable (the trainer passes the function "
                        f"actor.gae_lambda names, resolved); got {type(fn).__name__}.")
    ctx = gae_lambda_context(loss_mask, turn_ids, time_unit=time_unit)
    out = fn(ctx, **dict(kwargs or {}))
    label = f"actor.gae_lambda ({_import_path(fn)})"
    if not isinstance(out, torch.Tensor):
        raise PluginOutputError(f"{label}: must return a torch.Tensor; got {type(out).__name__}. Build it from "
                                "the context's tensors, e.g. torch.full_like(ctx.timestep_lengths, 0.95).")
    n_rows = loss_mask.shape[0]
    if tuple(out.shape) != (n_rows,):
        raise PluginOutputError(f"{label}: must return one value per local trajectory, shape ({n_rows},); got "
                                f"{tuple(out.shape)}. Return one lambda per row of ctx.timestep_lengths.")
    if out.device != loss_mask.device:
        raise PluginOutputError(f"{label}: returned a tensor on {out.device}; expected {loss_mask.device}, the "
                                "device of the context's tensors.")
    if not out.is_floating_point():
        raise PluginOutputError(f"{label}: must return a floating tensor; got {out.dtype}. Convert it with .float().")
    if not bool(torch.isfinite(out).all()):
        raise PluginOutputError(f"{label}: returned non-finite lambdas; every lambda must be a finite number "
                                "(usually in [0, 1]).")
    return out.detach().float()


def _import_path(fn: Callable) -> str:
    """``module.qualname`` of a lambda function, the import path the config names it by."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(fn)


def token_level_gae(
    rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, bootstrap: torch.Tensor,
    *, discount: float, gae_lambda: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE with one step per active token.

    Args:
        rewards, values: ``[B, S]`` finite floats (rewards at masked positions are ignored).
        loss_mask: ``[B, S]`` aligned mask (bool or 0/1).
        bootstrap: ``[B]`` value after each row's last active step (0 for rows that ended).
        discount: gamma.
        gae_lambda: a float or a ``[B]`` tensor.

    Returns:
        ``(advantages, returns)``, ``[B, S]`` float32.
    """
    m = as_float_mask(loss_mask)
    if _in_place(discount, gae_lambda):
        return _token_gae_in_place(rewards, values, m, bootstrap, discount, gae_lambda)
    return _compact_token_gae(rewards, values, m, bootstrap, discount, gae_lambda)


def turn_level_gae(
    rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, turn_ids: torch.Tensor,
    bootstrap: torch.Tensor, *, discount: float, gae_lambda: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE with one step per non-empty turn; the turn's advantage and return go to all its tokens.

    Same arguments as :func:`token_level_gae`, plus ``turn_ids``: ``[B, S]`` aligned, validated
    here (see :mod:`areal_trainer.advantage.turns`). ``rewards`` may also be ``[B]``: one reward per row
    at its last active token (where the outcome is placed), so all of it goes to the row's last turn.
    """
    m = as_float_mask(loss_mask)
    return _turn_gae(rewards, values, m, validated_turn_slots(turn_ids, m), bootstrap, discount, gae_lambda)


MIN_IN_PLACE_LAMBDA = 0.5
"""Smallest lambda of the in-place token kernel (see the module docstring)."""


def _in_place(discount: float, gae_lambda: float | torch.Tensor) -> bool:
    """Whether the in-place token kernel takes these settings (a static lambda, see the module docstring)."""
    if isinstance(gae_lambda, torch.Tensor):
        return False
    lam = float(gae_lambda)
    return MIN_IN_PLACE_LAMBDA <= lam <= 1.0 and MIN_STEP_COEF <= discount * lam <= 1.0


def _token_gae_in_place(rewards, values, mask, bootstrap, discount, lam):
    """Token GAE as one discounted sum over the active positions (see the module docstring)."""
    r, v = rewards.float(), values.float()
    k = 1.0 / lam
    x = r.mul(mask) if k == 1.0 else torch.add(r, v, alpha=k - 1.0).mul_(mask)
    y = stepwise_discounted_cumsum(x, mask, discount * lam, bootstrap.float() * discount)
    adv = y.sub_(v, alpha=k).mul_(mask)  # 0 where inactive
    return adv, adv + v


def _compact_token_gae(rewards, values, mask, bootstrap, discount, gae_lambda):
    """Token GAE with each row's active tokens compacted to the front (any lambda); see the module docstring."""
    n_rows = mask.shape[0]
    r, v = rewards.float(), values.float()
    step = mask.cumsum(-1)  # 1-based step of every position (exact in float32 below 2**24)
    n_steps = step[:, -1:].clone()
    width = max(int(n_steps.max()), 1) if n_rows else 1  # the one host sync: trims the step arrays
    # Column of each position in the compact step arrays; column 0 is a spill for inactive positions,
    # and columns 1..width hold the steps (a step owns one position, so plain scatter suffices).
    at = step.mul_(mask).long()
    r_steps = r.new_zeros(n_rows, width + 1).scatter_(1, at, r)[:, 1:]
    v_steps = v.new_zeros(n_rows, width + 1).scatter_(1, at, v)[:, 1:]
    # Value of the next step; after a row's last step, its bootstrap. Past the last step everything
    # is 0, so delta is 0 there (a row without steps gets a stray delta nobody reads).
    v_next = torch.cat([v_steps[:, 1:], v_steps.new_zeros(n_rows, 1)], dim=-1)
    v_next.scatter_(1, (n_steps - 1).clamp(min=0).long(), bootstrap.float()[:, None])
    delta = v_next.mul_(discount).add_(r_steps).sub_(v_steps)  # r + gamma * V_next - V, in place
    adv_steps = reverse_discounted_cumsum(delta, discount * gae_lambda)
    # Gathering with a leading zero column leaves inactive positions at 0 without a mask multiply.
    adv = F.pad(adv_steps, (1, 0)).gather(1, at)
    return adv, adv + v


def _turn_gae(rewards, values, mask, turns: TurnSlots, bootstrap, discount, gae_lambda):
    """GAE over turns from :func:`~areal_trainer.advantage.turns.validated_turn_slots` (consumed); see the
    module docstring. The turn arrays have one column per turn id: each turn's first token is found by binary
    search in the sorted running slots, its reward sum is the difference of one cumulative sum read before it
    and before the next id, and ids that no active token carries are skipped by the recurrence."""
    n_rows, seq_len = mask.shape
    v = values.float()
    if seq_len == 0:
        return torch.zeros_like(v), v.clone()
    slots, running, width = turns
    last = running[:, -1:]  # each row's last turn (its slot; 0 without one)
    slot = torch.arange(1, width + 1, device=mask.device, dtype=torch.float32).expand(n_rows, width).contiguous()
    first = torch.searchsorted(running, slot)  # [B, W] first position of each id; seq_len past the row's last
    at_first = first.clamp(max=seq_len - 1)
    live = (running.gather(1, at_first) == slot).float()  # ids some active token carries
    r_ids = _turn_rewards(rewards.float(), mask, first, last)
    # The recurrence runs over the live ids, compacted to the front (column 0 a spill for the others).
    step = live.cumsum(-1)
    n_steps = step[:, -1:].clone()
    at = step.mul_(live).long()
    r_steps = r_ids.new_zeros(n_rows, width + 1).scatter_(1, at, r_ids)[:, 1:]
    v_steps = v.new_zeros(n_rows, width + 1).scatter_(1, at, v.gather(1, at_first))[:, 1:]
    # Value of the next turn; after a row's last turn, its bootstrap (past it everything is 0).
    v_next = torch.cat([v_steps[:, 1:], v_steps.new_zeros(n_rows, 1)], dim=-1)
    v_next.scatter_(1, (n_steps - 1).clamp(min=0).long(), bootstrap.float()[:, None])
    delta = v_next.mul_(discount).add_(r_steps).sub_(v_steps)
    adv_steps = F.pad(reverse_discounted_cumsum(delta, discount * gae_lambda), (1, 0))
    adv_ids = adv_steps.gather(1, at)  # [B, W]
    ret_ids = adv_steps.add_(F.pad(v_steps, (1, 0))).gather(1, at)
    # Every token reads its id's column (slot 0, a leading zero, for inactive ones); returns there are the values.
    adv, returns = _read_columns((adv_ids, ret_ids), slots)
    return adv, torch.lerp(v, returns, mask, out=returns)  # exact for a 0/1 weight; into the read's new tensor


def _turn_rewards(r: torch.Tensor, mask: torch.Tensor, first: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """``[B, W]`` reward sum of each turn id (0 for ids without tokens) from ``[B, S]`` rewards, or from
    ``[B]`` rewards at each row's last active token (all of it to the row's ``last`` slot, ``[B, 1]``)."""
    if r.dim() == 1:
        r_ids = torch.zeros(first.shape, dtype=r.dtype, device=r.device)
        return r_ids.scatter_(1, (last - 1).clamp(min=0).long(), (r * last.clamp(max=1).squeeze(1))[:, None])
    # Rewards strictly before each id's first token (inactive positions add 0); past the row's ids, its total.
    total = torch.mul(r, mask).cumsum_(-1)
    before = total.gather(1, (first - 1).clamp_(min=0)).mul_(first > 0)
    return torch.cat([before[:, 1:], total[:, -1:]], dim=-1).sub_(before)


FLAT_LIMIT = 2**24
"""Largest flat index :func:`_read_columns` computes in float32 (exact below it)."""


def _read_columns(tables: tuple[torch.Tensor, ...], slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``out[b, s] = pad(table)[b, slots[b, s]]`` for each ``[B, W]`` table, a leading 0 column added;
    ``slots``: ``[B, S]`` float whole numbers in ``[0, W]`` (consumed).

    One int32 index into the flattened tables (index_select) where it fits: half the index memory of
    ``gather``'s int64 and faster on CPU."""
    n_rows, width = tables[0].shape
    padded = [F.pad(t, (1, 0)) for t in tables]
    if n_rows * (width + 1) >= FLAT_LIMIT:
        idx = slots.long()
        return tuple(t.gather(1, idx) for t in padded)
    base = torch.arange(0, n_rows * (width + 1), width + 1, device=slots.device, dtype=slots.dtype)
    flat = slots.add_(base[:, None]).int().view(-1)
    return tuple(t.view(-1).index_select(0, flat).view_as(slots) for t in padded)
