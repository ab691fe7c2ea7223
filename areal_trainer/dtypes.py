"""Precisions by name, in one place: the config keys (``*.dtype``, ``rollout.dtype``) take these names, and
:func:`torch_dtype` is the only map from a name to torch's dtype."""

from __future__ import annotations

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str | None):
    """``torch.float32`` for ``"float32"`` and so on; None for None."""
    if name is None:
        return None
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; one of {', '.join(DTYPE_NAMES)}")
    import torch

    return getattr(torch, name)
