"""Aggregation of per-token losses into the scalar that is backpropagated.

Four modes (names as in verl; see the peer survey for how other libraries name them):

* ``token-mean`` (AReaL, DAPO arXiv:2503.14476): ``sum over tokens / number of tokens`` across the
  whole optimizer step; long sequences weigh more.
* ``seq-mean-token-mean`` (GRPO as written in arXiv:2402.03300): each sequence's mean token loss,
  averaged over sequences.
* ``seq-mean-token-sum``: each sequence's summed token loss, averaged over sequences.
* ``seq-mean-token-sum-norm`` (Dr.GRPO, arXiv:2503.20783): each sequence's summed token loss divided
  by a constant (the response-length budget ``max_new_tokens``), averaged over sequences; no
  length-dependent weighting at all.

An optimizer step is split into micro-batches (and data-parallel ranks). For the aggregate to be
independent of that split, each micro-batch returns ``sum of its per-unit terms / N`` where ``N``
is the *global* number of units (tokens, or sequences with at least one loss token) of the step:
:func:`loss_normalizer` gives the local count, the trainer sums it over all micro-batches and
ranks, and passes the sum back. Summing the micro-batch losses then gives exactly the global mean.
Units are counted on the loss mask *before* any rejection filter, so dropping tokens never
up-weights the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .masked import row_count


@dataclass(frozen=True)
class Aggregation:
    """A mode: the unit it averages over (``token``: loss tokens; ``sequence``: rows with a loss
    token) and ``total(token_loss, mask, max_new_tokens)``, the micro-batch's sum of per-unit terms."""

    unit: str
    total: Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]


def _sum(token_loss: torch.Tensor, mask: torch.Tensor, max_new_tokens: int | None) -> torch.Tensor:
    return token_loss.sum()


def _sequence_means(token_loss: torch.Tensor, mask: torch.Tensor, max_new_tokens: int | None) -> torch.Tensor:
    return (token_loss.sum(-1) / row_count(mask).clamp_min(1)).sum()


def _sum_over_budget(token_loss: torch.Tensor, mask: torch.Tensor, max_new_tokens: int | None) -> torch.Tensor:
    return token_loss.sum() / float(max_new_tokens)


AGGREGATIONS = {
    "token-mean": Aggregation("token", _sum),
    "seq-mean-token-mean": Aggregation("sequence", _sequence_means),
    "seq-mean-token-sum": Aggregation("sequence", _sum),
    "seq-mean-token-sum-norm": Aggregation("sequence", _sum_over_budget),
}
LOSS_AGG_MODES = tuple(AGGREGATIONS)

Normalizer = torch.Tensor | float | int


def aggregation_problems(key: str, *, loss_agg_mode: str, max_new_tokens: int | None) -> list[str]:
    """``seq-mean-token-sum-norm`` divides by the length budget, which must be positive."""
    if loss_agg_mode == "seq-mean-token-sum-norm" and not (max_new_tokens or 0) > 0:
        return [f"{key}.loss_agg_mode='seq-mean-token-sum-norm' needs {key}.max_new_tokens > 0; "
                f"got {max_new_tokens!r}."]
    return []


def loss_normalizer(loss_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Local number of aggregation units in ``loss_mask`` (``[B, S]``), as a 0-dim float32 tensor.

    ``token-mean``: the number of loss tokens. Every ``seq-mean-*`` mode: the number of rows with at
    least one loss token.
    """
    mask = loss_mask.bool()
    if AGGREGATIONS[mode].unit == "token":
        return mask.sum(dtype=torch.float32)
    return mask.any(dim=-1).sum(dtype=torch.float32)


def aggregate_loss(
    token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: str,
    normalizer: Normalizer | None = None,
    max_new_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce per-token losses to this micro-batch's share of the step objective.

    Args:
        token_loss: ``[B, S]`` per-token loss, already 0 at every token that must not contribute
            (padding, prompt, rejected tokens).
        loss_mask: ``[B, S]`` loss mask *before* rejection filters: it defines the units counted and,
            for ``seq-mean-token-mean``, each sequence's length.
        mode: a key of :data:`AGGREGATIONS`.
        normalizer: global unit count of the step (sum of :func:`loss_normalizer` over all micro-batches
            and ranks); None uses this micro-batch's own count. Values below 1 are raised to 1, so an
            empty step gives a 0 loss rather than NaN.
        max_new_tokens: the constant divisor of ``seq-mean-token-sum-norm``.

    Returns:
        ``(loss, normalizer_used)``: 0-dim float32 loss and the normaliser it was divided by.
    """
    mask = loss_mask.bool()
    token_loss = torch.where(mask, token_loss.float(), 0.0)
    if normalizer is None:
        norm = loss_normalizer(mask, mode)
    elif isinstance(normalizer, torch.Tensor):
        norm = normalizer.detach().to(device=token_loss.device, dtype=torch.float32).reshape(())
    else:
        # A fill on the device, not a host-to-device copy.
        norm = token_loss.new_full((), float(normalizer))
    norm = norm.clamp_min(1.0)
    return AGGREGATIONS[mode].total(token_loss, mask, max_new_tokens) / norm, norm
