"""Precisions by name, in one place: the config keys (``*.dtype``, ``rollout.dtype``) take these names, and
:func:`torch_dtype` is the only map from a name to torch's dtype."""

from __future__ import annotations

import math

DTYPE_NAMES = ("float32", "bfloat16", "float16")
FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32. Rewards become float32 tensors: a finite Python float beyond this becomes
infinite there."""


def fits_float32(x: float) -> bool:
    """``x`` (a float or an int) is finite and stays finite as a float32 (a reward the trainer can use)."""
    try:
        x = float(x)
    except OverflowError:  # an int too large for a float
        return False
    return math.isfinite(x) and abs(x) <= FLOAT32_MAX


def torch_dtype(name: str | None):
    """``torch.float32`` for ``"float32"`` and so on; None for None."""
    if name is None:
        return None
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; one of {', '.join(DTYPE_NAMES)}")
    import torch

    return getattr(torch, name)
