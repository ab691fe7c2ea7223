"""Importance ratios between the trained policy and a base policy.

* Token level (PPO, arXiv:1707.06347): ``r_t = pi_theta(x_t) / pi_base(x_t)``.
* Sequence level (GSPO, arXiv:2507.18071): the geometric mean of the token ratios over the
  sequence's loss tokens, ``r_i = exp(mean_t(log pi_theta - log pi_base))``, shared by every token of
  the sequence and paired with the sequence-mean advantage.

The log-ratio is clamped to ``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]`` before the exponential: one
token whose log-probability moved by more than that (ratio beyond ``e^20``, about 5e8) would
otherwise make the ratio ``inf`` and its gradient ``0 * inf = NaN``, and the whole optimizer step
would be skipped; clamped, it simply gets no gradient through its ratio (the PPO clip would have
cut it anyway). :data:`RATIOS` registers the levels by the name ``actor.importance_sampling_level``
takes.

All tensors are ``[B, S]``; ``mask`` is bool. Ratios are 0 outside the mask.
"""

from __future__ import annotations

import torch

from .masked import row_mean

LOG_RATIO_BOUND = 20.0
"""The log importance ratio is clamped to +-20 before ``exp`` (see the module docstring)."""


def masked_log_ratio(logp: torch.Tensor, base_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` ``logp - base_logp`` on the mask, clamped to +-``LOG_RATIO_BOUND``; exactly 0 (with zero
    gradient) elsewhere. Selecting before any exponential keeps padding garbage (e.g. -inf logprobs)
    out of the loss."""
    return torch.where(mask, (logp - base_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), 0.0)


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


def token_level(logp, base_logp, advantages, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO: per-token ratios, the advantages as they are."""
    return token_ratio(logp, base_logp, mask), torch.where(mask, advantages, 0.0)


def sequence_level(logp, base_logp, advantages, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO: the sequence ratio and the sequence-mean advantage, on every loss token of the row."""
    return sequence_ratio(logp, base_logp, mask), sequence_mean_advantage(advantages, mask)


RATIOS = {"token": token_level, "sequence": sequence_level}
IS_LEVELS = tuple(RATIOS)


def importance_ratio(
    logp: torch.Tensor,
    base_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ratio and matching advantages for ``level`` (a key of :data:`RATIOS`).

    Returns:
        ``(ratio, advantages)``, both ``[B, S]`` and 0 outside ``mask``. At sequence level the
        advantages are replaced by the per-sequence mean, as GSPO defines its objective.
    """
    return RATIOS[level](logp, base_logp, advantages, mask)
