"""Collect one training batch of trajectory groups synchronously, applying the dynamic-sampling filter;
and what every rollout source shares: running the workflow on prompts, and the batch's metrics.

Fixed batch size (default): keep sampling new prompts until ``batch_size`` groups are accepted,
for at most ``rollout.max_sampling_rounds`` rounds, then fail with a clear error.
``dynamic_bs=true``: train on what the first round accepted (another round only if it accepted
nothing), so the batch size varies; if no round accepted anything the step is skipped (an empty
list is returned) rather than failing the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ...errors import PluginOutputError, UserError
from ...metrics import Mean, Metric, Sum, reduce
from ...rollout.types import TrajectoryGroup, as_group, group_problems


@dataclass
class Batch:
    """What a rollout source hands the trainer for one step: the accepted groups (with their prompt
    ids), and metrics about the sampling (``rollout/...``, ``reward/...``, ``time/...``)."""

    groups: list[TrajectoryGroup]
    metrics: dict[str, Metric] = field(default_factory=dict)

    @property
    def prompt_ids(self) -> list[int]:
        return [g.prompt_id for g in self.groups if g.prompt_id is not None]


def rollout_groups(workflow, samples: list[dict], ids: Sequence[int], gconfig) -> list[TrajectoryGroup]:
    """``workflow.rollout(samples)`` as checked :class:`TrajectoryGroup`\\ s tagged with their prompt ids."""
    out = workflow.rollout(samples, gconfig)
    label = f"rollout.workflow {type(workflow).__module__}.{type(workflow).__qualname__}"
    if not isinstance(out, (list, tuple)) or len(out) != len(samples):
        got = f"{len(out)} groups" if isinstance(out, (list, tuple)) else type(out).__name__
        raise PluginOutputError(f"{label}: rollout() returned {got} for {len(samples)} prompts; it must return one "
                                "trajectory group per prompt, in order.")
    wrong = sorted({type(g).__name__ for g in out if not isinstance(g, (TrajectoryGroup, Mapping))})
    if wrong:
        raise PluginOutputError(f"{label}: rollout() returned a list of {', '.join(wrong)}; each item must be a "
                                "TrajectoryGroup (or a dict of its tensors) holding one prompt's trajectories, in "
                                "prompt order (see areal_trainer.rollout.types.TrajectoryGroup).")
    problems = [p for g in out for p in group_problems(g, label)]
    if problems:
        raise PluginOutputError("; ".join(dict.fromkeys(problems)))
    groups = [as_group(g) for g in out]
    for g, i in zip(groups, ids):
        g.prompt_id = int(i)
    return groups


def sampled_metrics(sampled: Sequence[TrajectoryGroup], accepted: Sequence[TrajectoryGroup]) -> dict[str, Metric]:
    """Filtering and reward statistics of every group sampled for a batch (accepted or not): the groups'
    own stats (the reward's counters and source means) combined."""
    rewards = sum(float(g["rewards"].sum()) for g in sampled)
    answers = sum(g["rewards"].numel() for g in sampled)
    return {"rollout/accepted_groups": Sum(len(accepted)), "rollout/sampled_groups": Sum(len(sampled)),
            "rollout/accept_rate": Mean(len(accepted) / max(len(sampled), 1), max(len(sampled), 1)),
            "reward/sampled": Mean(rewards / max(answers, 1), answers), **reduce([g.stats for g in sampled])}


def collect_groups(loader, workflow, gconfig, *, batch_size: int, accept: Callable | None, dynamic_bs: bool,
                   max_rounds: int, world_size: int = 1, reduce_max: Callable[[int], int] = lambda x: x) -> Batch:
    """The accepted groups of one batch, and metrics about filtering.

    With several processes ``batch_size`` is this process's share and ``reduce_max`` takes the
    maximum over processes, so that all of them run the same rounds and draw the same number of
    prompts from the (shared-order) loader: no prompt is used twice.
    """
    accepted: list[TrajectoryGroup] = []
    sampled: list[TrajectoryGroup] = []
    for _ in range(max_rounds):
        want = batch_size if (dynamic_bs or accept is None) else reduce_max(batch_size - len(accepted))
        ids = loader.take_ids(want * world_size)
        groups = rollout_groups(workflow, [loader.samples[i] for i in ids], ids, gconfig)
        sampled += groups
        accepted += [g for g in groups if accept is None or accept(g)]
        short = batch_size - len(accepted) if not dynamic_bs else int(not accepted)
        if accept is None or reduce_max(short) <= 0:
            break
    else:
        if not dynamic_bs:
            raise UserError(
                f"rollout.dynamic_filter accepted only {len(accepted)} of {len(sampled)} prompt groups in "
                f"rollout.max_sampling_rounds={max_rounds} rounds (needed {batch_size}). Raise "
                "rollout.max_sampling_rounds or gconfig.n_samples, set dynamic_bs=true, or loosen the filter.")
    accepted = accepted[:batch_size] if not dynamic_bs else accepted
    if dynamic_bs and reduce_max(int(not accepted)) > 0:
        accepted = []  # some process has nothing to train on: every process skips this step together
    return Batch(accepted, sampled_metrics(sampled, accepted))
