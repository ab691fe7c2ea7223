"""The ``turn_ids`` contract: validation and the first token of every turn.

Workflows return token-aligned ``turn_ids`` (``[B, S]`` integers): every generated token of one
assistant turn shares an id in ``[0, S)``, ids never decrease over time, and every other position
is -1. Gaps in the numbering are allowed and cost no GAE step. The advantage code aligns them
(roll left by one, like the loss mask) and validates them against the aligned mask.

Masks here are float 0/1 tensors and ids are handled as float32 (exact below 2**24): on CPU
comparisons that produce bool tensors cost several times more than float arithmetic.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
MISSING_TURN_IDS = ("turn-level GAE (gae_timestep_unit='turn' or estimator turn_gae) requires rollout data to include "
                    "'turn_ids': return them from the workflow ([B, S] ints, -1 outside generated turns), or use "
                    "token-level GAE.")


def as_float_mask(mask: torch.Tensor) -> torch.Tensor:
    """A 0/1 float32 view of a bool, integer or float mask."""
    return mask if mask.dtype == torch.float32 else mask.float()


def check_turn_ids_format(turn_ids: torch.Tensor, loss_mask: torch.Tensor) -> None:
    """Shape, device and dtype of ``turn_ids`` (no host sync); ``ValueError`` when wrong."""
    if not isinstance(turn_ids, torch.Tensor):
        raise ValueError(f"turn_ids must be a torch.Tensor; got {type(turn_ids).__name__}.")
    if tuple(turn_ids.shape) != tuple(loss_mask.shape):
        raise ValueError(f"turn_ids must have shape {tuple(loss_mask.shape)} like loss_mask and input_ids; "
                         f"got {tuple(turn_ids.shape)}.")
    if turn_ids.device != loss_mask.device:
        raise ValueError(f"turn_ids must be on the device of loss_mask ({loss_mask.device}); got {turn_ids.device}.")
    if turn_ids.dtype not in INT_DTYPES:
        raise ValueError(f"turn_ids must have an integer dtype (uint8, int8, int16, int32 or int64; signed "
                         f"recommended for the -1 sentinel); got {turn_ids.dtype}.")


def check_turn_ids(turn_ids: torch.Tensor, loss_mask: torch.Tensor) -> None:
    """Validate aligned ``turn_ids`` against the aligned ``loss_mask`` (one host sync).

    Raises:
        ValueError: wrong shape, device or dtype.
        RuntimeError: an active id is negative, >= S, or smaller than an earlier active id.
    """
    validated_turn_slots(turn_ids, loss_mask)


class TurnSlots(NamedTuple):
    """Validated turn ids as the turn kernels read them.

    Attributes:
        slots: ``[B, S]`` float32, each active token's turn id plus one, 0 elsewhere.
        running: ``[B, S]`` float32, the running maximum of ``slots`` along the row (sorted: the slot of the
            latest turn so far, 0 before the first), so the first position where ``running`` reaches ``j`` is
            the first token of the turn with id ``j - 1``.
        width: the largest slot of the batch (the largest active id plus one), at least 1.
    """

    slots: torch.Tensor
    running: torch.Tensor
    width: int


def validated_turn_slots(turn_ids: torch.Tensor, loss_mask: torch.Tensor) -> TurnSlots:
    """:func:`check_turn_ids`, then the ids as :class:`TurnSlots` (one host sync for the checks and the width)."""
    check_turn_ids_format(turn_ids, loss_mask)
    m = as_float_mask(loss_mask)
    if m.numel() == 0:
        return TurnSlots(m.clone(), m.clone(), 1)
    slots = torch.mul(turn_ids, m)  # float32; inactive ids are irrelevant (and may be anything): 0 from here
    seq_len = slots.shape[-1]
    # Inactive positions are 0 here, so plain min/max over the batch decide the range rules.
    low, high = torch.aminmax(slots)
    slots.add_(m)
    running = slots.cummax(dim=-1).values
    # An active token behind the running maximum has an id below an earlier one (inactive ones give 0 here).
    behind = torch.addcmul(slots, running, m, value=-1).amin()
    low, high, behind = torch.stack([low, high, behind]).tolist()  # whole numbers, exact in float32 below 2**24
    if low < 0:
        raise RuntimeError("turn_ids must be non-negative at active (loss) positions; use -1 only on prompt, "
                           "tool, user and padding tokens.")
    if high > seq_len - 1:
        raise RuntimeError(f"turn_ids must be smaller than the sequence length ({seq_len}) at active positions.")
    if behind < 0:
        raise RuntimeError("turn_ids must be temporally nondecreasing across active positions (one id per "
                           "assistant turn, in generation order).")
    return TurnSlots(slots, running, max(int(high) + 1, 1))


def validated_turn_starts(turn_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """:func:`check_turn_ids`, then ``[B, S]`` float 0/1 marking the first active token of each turn."""
    slots, running, _ = validated_turn_slots(turn_ids, loss_mask)
    if slots.numel() == 0:
        return slots
    # A turn starts where an active slot exceeds the running maximum before it (0 before the first turn);
    # inactive positions (slot 0) never do.
    slots[:, 1:].sub_(running[:, :-1])
    return slots.clamp_(0, 1)
