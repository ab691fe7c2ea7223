"""Masked reductions over ``[B, S]`` tensors without data-dependent shapes.

Everything uses ``torch.where`` rather than boolean indexing, because indexing with a mask needs
the number of selected elements on the host (a device synchronisation), and because ``where``
keeps NaN/Inf at excluded positions out of both the value and the gradient.
"""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-dim sum of ``x`` over ``mask`` (same shape)."""
    return torch.where(mask, x, 0.0).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor | None = None) -> torch.Tensor:
    """0-dim ``sum(x over mask) / max(count, 1)``; ``count`` defaults to the number of masked elements.

    Passing a larger ``count`` (e.g. the pre-filter token count) turns it into a fraction of that count.
    """
    if count is None:
        count = mask.sum()
    return masked_sum(x, mask) / count.clamp_min(1)


def masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-dim minimum over ``mask``; +inf when nothing is selected (the identity of a min-reduction)."""
    if x.numel() == 0:
        return x.new_full((), float("inf"))
    return torch.where(mask, x, float("inf")).amin()


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-dim maximum over ``mask``; -inf when nothing is selected (the identity of a max-reduction)."""
    if x.numel() == 0:
        return x.new_full((), float("-inf"))
    return torch.where(mask, x, float("-inf")).amax()


def row_count(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` float32 number of masked positions per row."""
    return mask.sum(dim=-1, dtype=torch.float32)


def row_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` mean of ``x`` over each row's masked positions (0 for an empty row)."""
    return torch.where(mask, x, 0.0).sum(dim=-1) / row_count(mask).clamp_min(1)
