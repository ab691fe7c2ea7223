"""The teachers of on-policy distillation at run time: checked when the run starts (their tokenizers
against the student's, MOPD's routes against the training data; both before any weights load),
loaded with the other frozen models, and asked once per step for the log-probs of the tokens the step
trains on (and at each held-out evaluation for those of the held-out answers, ``train/evaluate.py``).

A teacher is a frozen model in eval mode, like the reference policy: it runs through the same
micro-batched, packed or shared-prefix forward and the chunked vocabulary head
(``policy_model.batched_logprobs``), on the trainer's device or on ``teacher.device``. Under FSDP2 each
process scores its own rows; the teacher is sharded like the policy (``teacher.shard``: each process holds
its share, every forward gathers one block at a time, and every process runs as many forwards) or, with
``teacher.shard=false`` or a ``teacher.device``, held whole by every process.
With MOPD each teacher runs only on the rows routed to it (a prompt's rows share a route, so its
shared prefix stays whole). Only trained tokens (the aligned loss mask) are kept; a non-finite
log-prob at one of them stops the run, naming the teacher and the step, and is never set to 0.
"""

from __future__ import annotations

import torch

from ... import fsdp
from ...advantage.align import aligned_mask
from ...components.distill import DistillSpec, TeacherSpec
from ...errors import UserError
from ...loss import TeacherLogprobs
from ...metrics import Metric, Sum
from ...model.load import autocast_dtype, load_processor, resolve_device
from ...model.prefix import GroupPrefix, group_prefix, resolve_tree_training
from ...model.teacher import image_problem, load_teacher, load_teacher_tokenizer, tokenizer_source, vocabulary_problem
from ...reward.service import RewardScores
from ..state import manifest
from ..state.checkpoint import weight_stats
from .policy import batched_logprobs


def check_teachers(spec: DistillSpec, tokenizer, *, student_key: str, student_path: str, samples,
                   processor=None, images: bool = False) -> None:
    """At start-up, before any weights: every teacher's vocabulary equals the student's, every training
    row's routing value has a teacher (MOPD), and with image rows (``images``) every teacher sees the images
    as the student's ``processor`` made them. Raises one :class:`UserError` listing every problem."""
    problems = []
    for t in spec.teachers:
        other = load_teacher_tokenizer(t.path, key=t.key)
        msg = vocabulary_problem(tokenizer, other, student_key=student_key, student_path=student_path, key=t.key,
                                 path=t.path)
        if msg is None and images:
            mine = load_processor(tokenizer_source(t.path), tokenizer=other, key=t.key)
            msg = image_problem((processor, tokenizer), (mine, other), key=t.key, path=t.path,
                                student_key=student_key, student_path=student_path)
        if msg:
            problems.append(msg)
    if spec.identifier is not None:
        seen: dict[str, int] = {}
        for i, s in enumerate(samples):
            seen.setdefault(str(route_value(spec, s)), i)
        for value, i in seen.items():
            try:
                spec.route(value, where=f"training row {i}")
            except UserError as e:
                problems.append(str(e))
    if problems:
        raise UserError("\n".join(problems) if len(problems) == 1 else
                        f"{len(problems)} teacher problems:\n" + "\n".join(f"  - {p}" for p in problems))


def route_value(spec: DistillSpec, sample: dict):
    """A dataset sample's value of the routing column (None where it has none)."""
    return (sample.get("fields") or {}).get(spec.identifier)


class NoReward:
    """The reward service of pure distillation's training rollouts: every answer gets 0 and no reward
    function is ever called (the held-out evaluation keeps the real reward)."""

    def score_completions(self, rows, completions) -> RewardScores:
        return RewardScores.empty(len(completions), [])

    def score(self, samples) -> RewardScores:
        return RewardScores.empty(len(samples), [])

    async def ascore(self, samples) -> RewardScores:
        return RewardScores.empty(len(samples), [])

    def close(self) -> None:
        pass


class Teachers:
    """The loaded teachers of a run (see the module docstring)."""

    def __init__(self, spec: DistillSpec, models: dict[str, torch.nn.Module], device: torch.device, samples,
                 mesh=None):
        self.spec, self.models, self.device, self.samples = spec, models, device, samples
        self.autocast = {t.name: autocast_dtype(t.dtype, device) for t in spec.teachers}
        self.share, self.lines = {}, []
        for name, model in models.items():
            self.share[name], line = resolve_tree_training(model.base_model, spec.enable_tree_training,
                                                           "teacher.enable_tree_training")
            if line:
                self.lines.append(f"teacher {name}: {line}")
        # Sharded after the probe above (it needs the whole model); every process then runs every teacher.
        self.sharded = mesh is not None and spec.shard and spec.device is None
        if self.sharded:
            for name, model in models.items():
                fsdp.shard_model(model, mesh)
                self.lines.append(f"teacher {name}: sharded over {mesh.size()} processes (teacher.shard)")

    @classmethod
    def load(cls, spec: DistillSpec, *, tokenizer, device: torch.device, seed: int, samples, mesh=None) -> Teachers:
        """Every teacher of ``spec``, on ``teacher.device`` or ``device``; with ``mesh`` (FSDP2) sharded over
        it unless ``teacher.shard`` is false or the teachers have a device of their own."""
        where = resolve_device(spec.device) if spec.device else device
        models = {}
        for t in spec.teachers:
            if (wrong := manifest.model_problem(t.path)) is not None:
                raise UserError(f"teacher {t.name!r} ({t.key}={t.path!r}) is a damaged checkpoint: {wrong}. Give an "
                                "intact checkpoint as the teacher (an earlier step of the same run).")
            models[t.name] = load_teacher(t.path, tokenizer=tokenizer, dtype=t.dtype, device=where, seed=seed,
                                          key=t.key)
            if not weight_stats(models[t.name].state_dict())["finite"]:
                raise UserError(f"teacher {t.name!r} ({t.key}={t.path!r}) has NaN or infinite weights: the checkpoint "
                                "is damaged or its run diverged. Give a healthy checkpoint as the teacher.")
        return cls(spec, models, where, samples, mesh)

    @property
    def any_share(self) -> bool:
        return any(self.share.values())

    def routes(self, batch, samples=None) -> list[dict[str, float]]:
        """Per prompt group of ``batch``: its teachers and their weights. ``samples``: the rows the groups'
        ``prompt_id`` index (default: the training rows; the held-out evaluation passes its own)."""
        if self.spec.identifier is None:
            return [self.spec.route(None)] * len(batch.group_sizes)
        rows, kind = (self.samples, "training") if samples is None else (samples, "held-out")
        out = []
        for pid in batch.prompt_ids:
            if pid is None:
                raise UserError("teacher: MOPD routes rows by their dataset row, but a trajectory group carries no "
                                "prompt_id (a custom rollout source?); set TrajectoryGroup.prompt_id.")
            out.append(self.spec.route(route_value(self.spec, rows[pid]), where=f"{kind} row {pid}"))
        return out

    @torch.no_grad()
    def score(self, batch, groups: GroupPrefix | None, step: int, samples=None
              ) -> tuple[TeacherLogprobs, dict[str, Metric]]:
        """The teachers' ``[B, S]`` log-probs of ``batch``'s trained tokens (next-token aligned; 0 elsewhere)
        and their weights, plus the rows each teacher scored. ``groups``: the batch's prompt groups
        when any model shares prefixes; ``step``: the step being trained (named in errors); ``samples``:
        see :meth:`routes`."""
        mask = aligned_mask(batch.loss_mask).bool()
        logp = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        weight = torch.zeros_like(logp)
        routes = self.routes(batch, samples)
        starts = [0]
        for n in batch.group_sizes:
            starts.append(starts[-1] + n)
        metrics: dict[str, Metric] = {}
        for t in self.spec.teachers:
            picked = [(g, routes[g][t.name]) for g in range(len(routes)) if t.name in routes[g]]
            if not picked:
                if self.sharded:  # its forwards are collectives: run them with no rows of this process
                    self._forward(t, batch, [], None, [])
                continue
            rows = [r for g, _ in picked for r in range(starts[g], starts[g + 1])]
            w = torch.tensor([wt for g, wt in picked for _ in range(starts[g], starts[g + 1])],
                             dtype=torch.float32, device=mask.device)[:, None]
            whole = len(rows) == mask.shape[0]
            sizes = [batch.group_sizes[g] for g, _ in picked]
            lp = self._forward(t, batch, rows, groups if whole else None, sizes)
            m = mask[rows]
            self._check_finite(t, lp, m, batch, rows, step)
            logp[rows] += w * torch.where(m, lp, 0.0)
            weight[rows] += w * m
            if self.spec.identifier is not None:
                metrics[f"distill/teacher_rows/{t.name}"] = Sum(float(len(rows)))
        return TeacherLogprobs(logp, weight), metrics

    def _forward(self, t: TeacherSpec, batch, rows: list[int], groups: GroupPrefix | None,
                 sizes: list[int]) -> torch.Tensor:
        idx = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
        ids, am = batch.input_ids[idx].to(self.device), batch.attention_mask[idx].to(self.device)
        prefix = None
        if self.share[t.name] and rows:
            prefix = groups if groups is not None else group_prefix(ids, am, sizes)
        model = self.models[t.name]
        vision = tuple(batch.vision[r] for r in rows) if batch.vision else ()  # the student's images, as it saw them
        lp = batched_logprobs(model, ids, am, temperature=self.spec.temperature,
                              mb_spec=self.spec.mb_spec, autocast=self.autocast[t.name], prefix=prefix,
                              vision=vision)
        if self.sharded:
            model.reshard()  # the root's weights stay gathered after a forward (it expects a backward)
        return lp.to(batch.input_ids.device)

    @staticmethod
    def _check_finite(t: TeacherSpec, lp: torch.Tensor, mask: torch.Tensor, batch, rows: list[int], step: int) -> None:
        bad = mask & ~torch.isfinite(lp)
        if not bool(bad.any()):
            return
        r, c = (int(x) for x in bad.nonzero()[0])
        token = int(batch.input_ids[rows[r], c + 1])
        raise UserError(f"teacher {t.name!r} ({t.key}={t.path!r}) gave a non-finite log-probability "
                        f"({float(lp[r, c])}) at a trained token at step {step} (batch row {rows[r]}, position "
                        f"{c + 1}, token id {token}); {int(bad.sum())} trained tokens of this step are affected. "
                        f"Its weights or its dtype ({t.dtype}) are broken for this input (try teacher.dtype=float32); "
                        "the run stops rather than train on a silently zeroed teacher signal.")
