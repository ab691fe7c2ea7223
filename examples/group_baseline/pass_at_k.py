"""Pass@k advantages as a group baseline: train for the chance that at least one of k answers is
right, not for the mean answer (Pass@k Training, Chen et al., 2025).

For a group of ``n`` answers of which ``c`` are right (``rewards > 0``) and ``n_neg = n - c`` wrong,
the expected pass@k of a random k-subset is ``R = 1 - C(n_neg, k) / C(n, k)``, with spread
``s = sqrt(R (1 - R))``. A right answer makes every subset containing it pass; a wrong one only
hurts the subsets that would otherwise fail:

    A_right = (1 - R) / s
    A_wrong = (1 - R - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / s

(0 where ``s = 0``: all right or all wrong). With ``k = 1`` this is GRPO's group standardisation
(population std). Binomials are computed with ``lgamma``, per row, with no loop over groups.

    python -m areal_trainer --config-name grpo \\
        actor.advantage.group_baseline.implementation=examples.group_baseline.pass_at_k.pass_at_k \\
        +actor.advantage.group_baseline.kwargs.k=4
"""

from __future__ import annotations

import torch

from areal_trainer.advantage import GroupBaselineInputs


def _binom(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``C(n, k)`` elementwise in float64; 0 where ``k < 0`` or ``k > n``."""
    ok = (k >= 0) & (k <= n)
    n, k = n.clamp(min=0), k.clamp(min=0)
    value = torch.exp(torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma((n - k).clamp(min=0) + 1))
    return torch.where(ok, value, 0.0)


def pass_at_k(inputs: GroupBaselineInputs, *, k: int = 4) -> torch.Tensor:
    """``[B]`` pass@k advantages of each answer within its prompt's group."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer; got {k!r}")
    device = inputs.scores.device
    sizes = torch.tensor(inputs.group_sizes, device=device)
    gid = torch.repeat_interleave(torch.arange(len(sizes), device=device), sizes, output_size=inputs.scores.numel())
    right = (inputs.rewards > 0).double()
    n = sizes.double()[gid]
    n_neg = torch.zeros(len(sizes), dtype=torch.float64, device=device).index_add_(0, gid, 1 - right)[gid]
    kk = torch.full_like(n, float(k)).minimum(n)  # a group smaller than k: every answer is in the subset
    pass_k = 1 - _binom(n_neg, kk) / _binom(n, kk)
    spread = (pass_k * (1 - pass_k)).sqrt()
    hurt = _binom(n_neg - 1, kk - 1) / _binom(n - 1, kk - 1).clamp(min=1e-300)
    adv = torch.where(right > 0, 1 - pass_k, 1 - pass_k - hurt)
    return torch.where(spread > 1e-12, adv / spread.clamp(min=1e-12), 0.0).float()
