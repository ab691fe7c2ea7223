"""Importance ratios between the trained policy and a base policy.

* Token level (PPO, arXiv:1707.06347): ``r_t = pi_theta(x_t) / pi_base(x_t)``.
* Sequence level (GSPO, arXiv:2507.18071): the geometric mean of the token ratios over the
  sequence's loss tokens, ``r_i = exp(mean_t(log pi_theta - log pi_base))``, shared by every token of
  the sequence and paired with the sequence-mean advantage.

All tensors are ``[B, S]``; ``mask`` is bool. Ratios are 0 outside the mask.
"""

from __future__ import annotations

import torch

from .masked import row_mean

IS_LEVELS = ("token", "sequence")


def masked_log_ratio(logp: torch.Tensor, base_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` ``logp - base_logp`` on the mask, exactly 0 (with zero gradient) elsewhere.

    Selecting before any exponential keeps padding garbage (e.g. -inf logprobs) out of the loss.
    """
    return torch.where(mask, logp - base_logp, 0.0)


def token_ratio(logp: torch.Tensor, base_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` per-token ratio ``exp(logp - base_logp)``, 0 outside the mask."""
    return torch.where(mask, torch.exp(masked_log_ratio(logp, base_logp, mask)), 0.0)


def sequence_ratio(logp: torch.Tensor, base_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` GSPO ratio: each row's geometric-mean token ratio, broadcast to its masked tokens."""
    seq_log_ratio = row_mean(masked_log_ratio(logp, base_logp, mask), mask)
    return torch.where(mask, torch.exp(seq_log_ratio).unsqueeze(-1), 0.0)


def sequence_mean_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` each row's mean advantage over its masked tokens, broadcast to them (0 elsewhere)."""
    return torch.where(mask, row_mean(advantages, mask).unsqueeze(-1), 0.0)


def importance_ratio(
    logp: torch.Tensor,
    base_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ratio and matching advantages for ``level`` ``token`` or ``sequence``.

    Returns:
        ``(ratio, advantages)``, both ``[B, S]`` and 0 outside ``mask``. At sequence level the
        advantages are replaced by the per-sequence mean, as GSPO defines its objective.
    """
    if level == "token":
        return token_ratio(logp, base_logp, mask), torch.where(mask, advantages, 0.0)
    if level == "sequence":
        return sequence_ratio(logp, base_logp, mask), sequence_mean_advantage(advantages, mask)
    raise ValueError(f"Invalid importance_sampling_level {level!r}; must be one of {IS_LEVELS}.")
