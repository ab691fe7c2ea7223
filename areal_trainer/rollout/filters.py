"""Dynamic-sampling filters: ``fn(group) -> bool`` decides whether a prompt's group is trained on.

``group`` is the trajectory-group dict of one prompt (``group["rewards"]`` is ``[G]``).
"""

from __future__ import annotations

import torch


def has_reward_variance(group: dict[str, torch.Tensor]) -> bool:
    """DAPO's dynamic sampling: keep groups whose answers did not all get the same reward
    (such groups have zero advantage under group normalisation and carry no gradient)."""
    r = group["rewards"]
    return bool((r != r[0]).any())
