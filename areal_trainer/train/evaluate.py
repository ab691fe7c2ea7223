"""Held-out evaluation: run the workflow on the validation prompts with ``eval_gconfig``.

``eval/reward`` is the mean reward of the held-out samples (an episode, for agents). Accuracy comes only
from a verifier (``evaluator.verifier``, bound in ``components/verifier.py``): a sample is correct when
the verifier's own value says so (``reward.is_correct`` under its verdict), read from the workflow's
``TrajectoryGroup.source_values``, never from a weighted sum of sources; an agent episode's verdict is
its reward before ``rollout.turn_discount``. ``eval/accuracy`` is pass@1 (the mean over all samples);
with ``eval_gconfig.n_samples = k > 1`` also ``eval/pass@k`` (a prompt passes when any of its k samples
is correct). A verifier chosen in auto counts only when every held-out value, over every process, is 0
or 1 (:func:`finish` drops the accuracy otherwise); without a verifier no accuracy is reported at all.

With a teacher, :func:`reverse_kl` adds ``eval/distill/*``: the teachers' scoring of the held-out answers
(``Teachers.score``) against the policy's log-probs, reduced as the training metrics ``distill/*`` are; not
when MOPD cannot route a held-out row (:func:`unscorable`, which the trainer warns about).
"""

from __future__ import annotations

import math

import torch

from ..advantage.align import aligned_mask
from ..components.verifier import VerifierSpec
from ..config.schema import GenerationHyperparameters
from ..errors import UserError
from ..loss.distill import distill_stats
from ..metrics import Mean, Metric, Sum, reduce
from ..model.prefix import group_prefix
from ..reward import is_correct
from .batch import TrainBatch
from .models.teacher import route_value
from .sources.collect import rollout_groups

UNREAD = "eval/unread_verdicts"
"""Held-out values that cannot be read as verdicts (not 0 or 1 for a verifier chosen in auto, or missing
from the workflow's output); summed over processes, then removed by :func:`finish`."""
ACCURACY_KEYS = ("eval/accuracy", "eval/pass@k")


def evaluate(workflow, samples: list[dict], gconfig: GenerationHyperparameters, batch_size: int,
             examples: list | None = None, *, verifier: VerifierSpec | None = None, turn_discount: float = 1.0,
             keep: list | None = None) -> dict[str, Metric]:
    """The held-out metrics of ``samples`` (combine over processes, then :func:`finish`). ``examples``: when a
    list, gets the first group and whether its first sample is correct (None without a verdict); ``keep``:
    when a list, gets every group (for :func:`reverse_kl`)."""
    rewards, verdicts, stats, unread = [], [], [], 0
    for i in range(0, len(samples), batch_size):
        batch = samples[i:i + batch_size]
        for group in rollout_groups(workflow, batch, range(i, i + len(batch)), gconfig):  # checked like training
            values = verdict_values(group, verifier, turn_discount)
            if examples is not None and not examples:
                examples.append((group, None if values is None else bool(is_correct(values[0], verifier.verdict))))
            rewards.append(episode_rewards(group))
            verdicts.append(torch.full_like(rewards[-1], math.nan) if values is None else values)
            unread += len(rewards[-1]) if values is None else 0
            stats.append(getattr(group, "stats", {}))
            if keep is not None:
                keep.append(group)
    r = torch.cat(rewards)
    out = {"eval/reward": Mean(float(r.mean()), float(r.numel())), **{f"eval/{k}": v for k, v in reduce(stats).items()}}
    if verifier is not None and verifier.active:
        out.update(accuracy(verdicts, verifier, gconfig.n_samples, unread=unread))
    return out


def accuracy(verdicts: list[torch.Tensor], verifier: VerifierSpec, n_samples: int, unread: int = 0
             ) -> dict[str, Metric]:
    """``eval/accuracy`` (and ``eval/pass@k``) from each group's verdict values (NaN: no value, never
    correct), with :data:`UNREAD`: ``unread`` plus, for a verifier chosen in auto, the values not 0 or 1."""
    if verifier.binary_only:
        unread += sum(int((~(torch.isnan(v) | (v == 0) | (v == 1))).sum()) for v in verdicts)
    correct = [is_correct(v, verifier.verdict).float() for v in verdicts]
    out: dict[str, Metric] = {UNREAD: Sum(float(unread))}
    if correct:
        c = torch.cat(correct)
        out["eval/accuracy"] = Mean(float(c.mean()), float(c.numel()))
        if n_samples > 1:
            out["eval/pass@k"] = Mean(float(torch.stack([x.max() for x in correct]).mean()), float(len(correct)))
    return out


def finish(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics of an evaluation combined over processes, without accuracy when any value was unread."""
    if metrics.pop(UNREAD, 0.0) > 0:
        for k in ACCURACY_KEYS:
            metrics.pop(k, None)
    return metrics


def verdict_values(group, verifier: VerifierSpec | None, turn_discount: float = 1.0) -> torch.Tensor | None:
    """One value per sample for the verifier to judge (NaN where its source gave none), or None when the
    group does not say (no verifier, or a workflow that sets no ``source_values`` for a weighted sum)."""
    if verifier is None or not verifier.active:
        return None
    if verifier.episodes:
        return undiscounted_episode_rewards(group, turn_discount)
    values = getattr(group, "source_values", None) or {}
    if verifier.source in values:
        return torch.tensor([math.nan if v is None else float(v) for v in values[verifier.source]])
    return group["rewards"].float() if verifier.rewards_are_values else None


def undiscounted_episode_rewards(group, turn_discount: float) -> torch.Tensor:
    """An agent group's episode rewards before the per-call discount: an agent that returns one reward has
    it on its last call, which its episode reward carries discounted once per call before it."""
    if not getattr(group, "episode_rows", None):
        return group["rewards"].float()
    calls = group["num_turns"].tolist() if "num_turns" in group else [1.0] * group.n_rows
    out, row = [], 0
    for n_rows, reward in zip(group.episode_rows, group.episode_rewards):
        n_calls = max(1, round(sum(calls[row:row + n_rows])))
        out.append(reward / turn_discount ** (n_calls - 1))
        row += n_rows
    return torch.tensor(out, dtype=torch.float32)


def episode_rewards(group) -> torch.Tensor:
    """One reward per episode: the rows' rewards, or an agent group's episode rewards (its rows are calls)."""
    if getattr(group, "episode_rows", None):
        return torch.tensor(group.episode_rewards, dtype=torch.float32)
    return group["rewards"].float()


def reverse_kl(policy, teachers, groups: list, *, samples: list[dict], step: int, device) -> dict[str, Metric]:
    """``eval/distill/reverse_kl`` (nats per answer token: ``log pi_theta - log pi_T`` at the held-out answers'
    tokens), ``eval/distill/teacher_logp`` and ``eval/distill/n_valid_tokens``, as the training's ``distill/*``
    (``loss/distill.py::distill_stats``). ``samples``: the rows the groups' ``prompt_id`` index (MOPD routes)."""
    batch = TrainBatch.from_groups(groups, device)
    share = policy.share or teachers.any_share
    prefix = group_prefix(batch.input_ids, batch.attention_mask, batch.group_sizes) if share else None
    logp = policy.logprobs(batch.input_ids, batch.attention_mask, prefix)
    teacher, _ = teachers.score(batch, prefix, step=step, samples=samples)
    stats = distill_stats(logp, teacher.logp, teacher.weight, aligned_mask(batch.loss_mask).bool())
    n = float(stats["distill/n_valid_tokens"].value)
    return {"eval/distill/reverse_kl": Mean(float(stats["distill/reverse_kl"].value), n),
            "eval/distill/teacher_logp": Mean(float(stats["distill/teacher_logp"].value), n),
            "eval/distill/n_valid_tokens": Sum(n)}


def unscorable(spec, samples: list[dict]) -> str | None:
    """Why the teachers of ``spec`` (a ``DistillSpec``) cannot score these held-out rows, or None: with MOPD, a
    row whose routing column no teacher takes (the held-out data need not carry the training's column)."""
    if spec.identifier is None:
        return None
    for i, s in enumerate(samples):
        try:
            spec.route(route_value(spec, s), where=f"held-out row {i}")
        except UserError as e:
            return str(e)
    return None
