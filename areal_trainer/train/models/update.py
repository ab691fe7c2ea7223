"""One optimizer update over a batch: minibatches (one optimizer step each), micro-batches
(forward/backward each), the global loss normaliser, gradient clipping, and skipping steps whose
loss or gradient norm is not finite.

Each optimizer step's loss is ``sum over its micro-batches of (sum of per-unit terms) /
normaliser``, where the normaliser (valid tokens, or sequences) is summed over all micro-batches
of the step *before* any backward. The gradient is therefore independent of the micro-batch split.

With an FSDP2-sharded model (``fsdp.py``) every forward/backward is a collective: ranks with fewer
micro-batches than the busiest rank run zero-weight copies of one of theirs, and the gradient
norm is that of the sharded (``DTensor``) gradients, the same on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ... import fsdp
from ...config.parts import MicroBatchSpec
from ...loss.stats import Reduction, Stat, reduce_stats
from ...metrics import Max, Mean, Metric, Min, Sum
from ...model.prefix import GroupPrefix, count_tree_tokens


@dataclass(frozen=True)
class UpdateResult:
    """What an update did: its metrics, the optimizer steps it ran and how many of them were skipped
    (a non-finite loss or gradient norm)."""

    metrics: dict[str, Metric] = field(default_factory=dict)
    n_steps: int = 0
    n_skipped: int = 0

    @property
    def all_skipped(self) -> bool:
        """Every optimizer step of the update was skipped (the weights did not change)."""
        return self.n_steps > 0 and self.n_skipped == self.n_steps


_METRIC = {Reduction.MIN: Min, Reduction.MAX: Max, Reduction.SUM: Sum}


def typed_stats(stats: dict[str, Stat]) -> dict[str, Metric]:
    """The loss's step statistics (reduced over micro-batches, ``loss/stats.py``) as metrics carrying the
    reduction each was made with across processes: a weighted mean keeps its summed weight (its tokens)."""
    out: dict[str, Metric] = {}
    for key, stat in stats.items():
        v = float(stat.value)
        if stat.reduction is Reduction.MEAN:
            out[key] = Mean(v) if stat.weight is None else Mean(v, weight=float(stat.weight))
        else:
            out[key] = _METRIC[stat.reduction](v)
    return out


def balanced_partition(sizes: list[int], n: int) -> list[list[int]]:
    """Split indices into ``n`` non-empty parts with balanced total size (first-fit decreasing)."""
    n = max(1, min(n, len(sizes)))
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    parts: list[list[int]] = [[] for _ in range(n)]
    loads = [0] * n
    for i in order:
        k = min(range(n), key=lambda j: (loads[j], len(parts[j])))
        parts[k].append(i)
        loads[k] += sizes[i]
    return [sorted(p) for p in parts if p]


def group_units(rows: list[int], lengths: list[int], prefix: GroupPrefix, budget: int | None = None
                ) -> tuple[list[list[int]], list[int]]:
    """``rows`` as runs of one prompt group each (split where a run would exceed ``budget`` tokens)
    and the tokens each run costs under shared-prefix training."""
    units: list[list[int]] = []
    for r in rows:
        if units and prefix.group[units[-1][-1]] == prefix.group[r] and (
                budget is None or prefix.cost(units[-1] + [r], lengths) <= budget):
            units[-1].append(r)
        else:
            units.append([r])
    return units, [prefix.cost(u, lengths) for u in units]


def micro_batches(rows: list[int], lengths: list[int], spec: MicroBatchSpec,
                  prefix: GroupPrefix | None = None) -> list[list[int]]:
    """Split ``rows`` into at least ``spec.n_mbs`` parts, each within ``spec.max_tokens_per_mb`` if set,
    their number rounded up to a multiple of ``spec.n_mbs_divisor``; runs of ``spec.granularity``
    consecutive rows stay together (at most one part per run). With ``prefix`` (shared-prefix
    training) the runs are the prompt groups instead, and tokens are counted as the shared forward
    computes them (a group's prefix once)."""
    if prefix is not None:
        units, sizes = group_units(rows, lengths, prefix, spec.max_tokens_per_mb)
    else:
        g = max(1, spec.granularity)
        units = [rows[i:i + g] for i in range(0, len(rows), g)]
        sizes = [sum(lengths[r] for r in u) for u in units]

    def parts_of(n: int) -> list[list[int]]:
        n = -(-n // spec.n_mbs_divisor) * spec.n_mbs_divisor
        return balanced_partition(sizes, n)

    n = spec.n_mbs
    if spec.max_tokens_per_mb:
        n = max(n, math.ceil(sum(sizes) / spec.max_tokens_per_mb))
        while True:
            parts = parts_of(n)
            if all(sum(sizes[i] for i in p) <= spec.max_tokens_per_mb for p in parts) or n >= len(units):
                break
            n += 1
    else:
        parts = parts_of(n)
    return [[r for i in p for r in units[i]] for p in parts]


def optimizer_steps(batch: Any, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    n_minibatches: int, mb_spec: MicroBatchSpec, grad_clip: float,
                    normalizer_of: Callable[[Any], torch.Tensor],
                    loss_of: Callable[[Any, torch.Tensor], tuple[torch.Tensor, dict]],
                    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    sync_grads: Callable[[list], None] | None = None,
                    prefix: GroupPrefix | None = None, name: str = "update") -> UpdateResult:
    """Run ``n_minibatches`` optimizer steps (at most one per row) over ``batch`` (a typed batch with
    ``input_ids``, ``attention_mask`` and ``select(rows)``, ``train/batch.py``).

    ``normalizer_of(micro)`` gives a micro-batch's share of the loss normaliser; ``loss_of(micro,
    normalizer)`` its loss (already divided by the step's global normaliser) and metrics.
    ``prefix``: the batch's prompt groups under shared-prefix training (``loss_of`` computes each
    micro-batch's common prefixes once). Minibatches are the same with or without it (balanced
    rows, so sharing does not change what each optimizer step sees); micro-batches keep a
    minibatch's rows of one group together.
    Metrics are named ``<name>/...``: ``tokens`` (real tokens of the batch), ``tokens_computed`` (tokens its
    forwards computed), ``loss``, ``grad_norm``, ``skipped_steps``; and the loss's own statistics.
    """
    lengths = batch.attention_mask.sum(1).tolist()
    micro_stats: list[dict] = []
    norms, losses = [], []
    skipped, computed = 0, 0
    params = [p for p in model.parameters() if p.requires_grad]
    sharded = fsdp.is_sharded(model)
    minibatches = balanced_partition(lengths, n_minibatches)
    for rows in minibatches:
        micros = [torch.tensor(m) for m in micro_batches(rows, lengths, mb_spec, prefix)]
        subs = [batch.select(m) for m in micros]
        computed += sum(count_tree_tokens(s.input_ids, s.attention_mask) if prefix is not None
                        else int(s.attention_mask.sum()) for s in subs)
        normalizer = sum(normalizer_of(s) for s in subs)
        if all_reduce is not None:
            normalizer = all_reduce(normalizer.clone())
        # FSDP2: each forward/backward is a collective; agree on their number before running any
        n_pad = fsdp.max_over_ranks(len(subs)) - len(subs) if sharded else 0
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=batch.input_ids.device)
        for sub in subs:
            loss, stats = loss_of(sub, normalizer)
            loss.backward()
            total = total + loss.detach()
            micro_stats.append(stats)
        for _ in range(n_pad):
            (loss_of(subs[0], normalizer)[0] * 0).backward()  # keeps the collectives in step; adds nothing
        if sync_grads is not None:
            sync_grads(params)
        norm = fsdp.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
        if not (torch.isfinite(total) and torch.isfinite(norm)):
            optimizer.zero_grad(set_to_none=True)  # weights untouched
            skipped += 1
        else:
            optimizer.step()
        norms.append(norm.detach().float())
        losses.append(total)
    metrics = typed_stats(reduce_stats(micro_stats))
    metrics.update({
        f"{name}/grad_norm": Mean(float(torch.stack(norms).mean())),  # of the summed gradient: one value for all ranks
        f"{name}/loss": Sum(float(torch.stack(losses).mean())),  # each process's share of the global loss
        f"{name}/skipped_steps": Max(float(skipped)),  # every process skips the same steps
        f"{name}/tokens": Sum(float(sum(lengths))),
        f"{name}/tokens_computed": Sum(float(computed)),
    })
    return UpdateResult(metrics, len(minibatches), skipped)
