"""From token-aligned rollout tensors to the next-token-aligned view the advantage math uses.

Rolling left by one (``x'[t] = x[t + 1]``) makes position ``t`` describe the prediction of token
``t + 1``, like the model forwards. The last column predicts nothing and is always inactive.
Also here: the truncation flag, the bootstrap value, masking pi_old and the per-token reward KL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..loss.kl import kl_estimate
from .turns import check_turn_ids_format


def shift_left(x: torch.Tensor, fill: float, dtype: torch.dtype) -> torch.Tensor:
    """``[B, S]`` new tensor ``x'[t] = x[t + 1]`` of ``dtype``, ``fill`` in the last column.

    One allocation and one pass (the dtype conversion happens in the copy), unlike roll + cast.
    """
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    out[:, :-1] = x[:, 1:]
    out[:, -1] = fill
    return out


def masked_shift_left(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` float32 ``x'[t] = x[t + 1] * mask[t]``, 0 in the last column (``mask``: the aligned float
    mask), detached.

    The shift, the conversion and the masking in one pass: the product is written straight into the shifted
    place (the same bits as shifting, converting and masking one after another: a factor 0 or 1 is exact).
    """
    out = torch.empty(mask.shape, dtype=torch.float32, device=mask.device)
    torch.mul(x.detach()[:, 1:], mask[:, :-1], out=out[:, :-1])
    out[:, -1] = 0.0
    return out


def aligned_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` float 0/1: the rollout mask shifted left by one, last column 0.

    Masks stay float from here on: masking is a multiplication (inputs are finite by contract),
    several times cheaper on CPU than ``torch.where`` with a bool condition.
    """
    return shift_left(loss_mask, 0.0, torch.float32)


def aligned_turn_ids(turn_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]``: the rollout ``turn_ids`` shifted left by one, -1 in the last column.

    int32 and int64 ids keep their dtype, narrower ones become int64 (room for the -1 sentinel).
    Shape, device and dtype are checked here; the values are checked where they are used.
    """
    check_turn_ids_format(turn_ids, mask)
    dtype = turn_ids.dtype if turn_ids.dtype in (torch.int32, torch.int64) else torch.int64
    return shift_left(turn_ids, -1, dtype)


def truncation_flags(data: Mapping[str, Any], seqlen: torch.Tensor, width: int) -> torch.Tensor:
    """``[B]`` bool: ``data['is_truncated']``, or (without it) rows as long as the padded ``width``.

    ``seqlen`` is ``[B]``, the real tokens of each row (``attention_mask`` summed).
    """
    n_rows = seqlen.shape[0]
    flags = data.get("is_truncated")
    if flags is None:
        return seqlen == width
    if not isinstance(flags, torch.Tensor):
        raise TypeError(f"data['is_truncated'] must be a torch.Tensor of shape ({n_rows},); got "
                        f"{type(flags).__name__}.")
    if tuple(flags.shape) != (n_rows,):
        raise ValueError(f"data['is_truncated'] must have shape ({n_rows},) (one flag per row); got "
                         f"{tuple(flags.shape)}.")
    return flags.to(device=seqlen.device).bool()


def bootstrap_values(values: torch.Tensor, seqlen: torch.Tensor) -> torch.Tensor:
    """``[B]``: the value after each row's last real token, ``V[b, seqlen_b - 1]``."""
    last = (seqlen - 1).clamp(min=0).long()[:, None]
    return values.float().gather(1, last).squeeze(1)


def old_logprobs(inputs_old: torch.Tensor | None, data: Mapping[str, Any], mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` masked pi_old: the given next-token-aligned ``inputs_old``, else the behaviour
    ``logprobs`` rolled into alignment."""
    if inputs_old is not None:
        return inputs_old.float() * mask
    return masked_shift_left(data["logprobs"], mask)


def reward_kl(
    old: torch.Tensor, ref: torch.Tensor | None, mask: torch.Tensor, *, kl_ctl: float, estimator: str
) -> torch.Tensor | None:
    """``[B, S]`` per-token KL reward ``-kl_ctl * KL(old, ref)``, 0 when masked; None (no KL at all)
    without ``ref`` or with kl_ctl 0."""
    if ref is None or kl_ctl == 0:
        return None
    kl = kl_estimate(old, ref.float() * mask, estimator, clamp=True)
    return kl * (-kl_ctl * mask)
