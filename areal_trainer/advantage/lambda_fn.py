"""Built-in GAE lambda functions: ``fn(ctx: GAELambdaContext, **kwargs) -> [B]`` lambdas.

Select one with ``actor.gae_lambda: areal_trainer.advantage.lambda_fn.<name>`` and pass its
parameters in ``actor.gae_lambda_kwargs``. ``L`` below is ``ctx.timestep_lengths``: tokens or turns,
following the estimator that uses the lambda.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # only for annotations: keeps this module's public names to the lambda functions
    from .gae import GAELambdaContext


def constant_gae_lambda(ctx: GAELambdaContext, value: float) -> torch.Tensor:
    """The same ``value`` for every row."""
    return torch.full_like(ctx.timestep_lengths, float(value), dtype=torch.float32)


def vapo_length_adaptive_gae(ctx: GAELambdaContext, alpha: float) -> torch.Tensor:
    """VAPO's length-adaptive lambda: ``max(0, 1 - 1 / (alpha * L))``, and 0 for an empty row.

    Longer rows get a lambda closer to 1 (less bias over long horizons). With ``alpha = 1``:
    L = 4 -> 0.75, L = 2 -> 0.5, L = 1 -> 0.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a positive number (VAPO uses 0.05); got {alpha!r}.")
    length = ctx.timestep_lengths.float()
    lam = (1.0 - 1.0 / (float(alpha) * length.clamp_min(1.0))).clamp_min(0.0)
    return torch.where(length > 0, lam, torch.zeros_like(lam))


def relative_position_gae_lambda(ctx: GAELambdaContext, q: float) -> torch.Tensor:
    """``lambda = q ** (1 / (L - 1))``: with gamma = 1 a terminal reward keeps the fraction ``q`` at
    the first step and 1 at the last, whatever the row's length (equal relative positions keep equal
    fractions). ``L = 1`` gives 1 and ``L = 0`` gives 0.
    """
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not math.isfinite(q) or not 0 < q <= 1:
        raise ValueError(f"q must be a finite number in (0, 1] (the share of a terminal reward kept at the "
                         f"first step); got {q!r}.")
    length = ctx.timestep_lengths.float()
    lam = torch.pow(torch.full_like(length, float(q)), 1.0 / (length - 1.0).clamp_min(1.0))
    lam = torch.where(length == 1, torch.ones_like(lam), lam)
    return torch.where(length > 0, lam, torch.zeros_like(lam))
