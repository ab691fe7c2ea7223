"""Binding ``teacher`` once, at start-up: which teachers, how a row is routed to them, which loss form
with which weights, and the policy loss wrapped with the distillation term.

``bind_distill(cfg, problems)`` returns a :class:`DistillSpec` (None without a ``teacher`` section) and
appends the rules that span sections to ``problems`` (the section's own rules are
``config/teacher.py``'s). Nothing loads here: the teachers' tokenizers are compared with the student's
and their routes with the dataset when the run starts (``train/models/teacher.py``), before any weights load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError


@dataclass(frozen=True)
class TeacherSpec:
    """One teacher: its name (``teacher`` for a single one), the key its path came from, and its weight."""

    name: str
    key: str
    path: str
    dtype: str
    weight: float = 1.0


@dataclass(frozen=True)
class DistillSpec:
    """The bound ``teacher`` section.

    Attributes:
        form: ``joint``, ``advantage`` or ``mopd``.
        rl_weight, distill_weight: the weights of the form in use.
        ratio_cap: MOPD's IS-weight cap.
        teachers: every teacher.
        identifier: the dataset column that routes rows (MOPD with ``teacher.teachers``), or None (every
            row goes to the one teacher).
        routes: route value -> {teacher name: weight}, beside routing a value to the teacher of that name.
        temperature, device, mb_spec, enable_tree_training, shard: how the teachers' forwards run.
    """

    form: str
    rl_weight: float
    distill_weight: float
    teachers: tuple[TeacherSpec, ...]
    ratio_cap: float = 5.0
    identifier: str | None = None
    routes: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    temperature: float = 1.0
    device: str | None = None
    mb_spec: Any = None
    shard: bool = True
    enable_tree_training: bool | None = None

    @property
    def pure(self) -> bool:
        """RL weight 0: no reward and no advantage estimation run (AReaL's pure distillation)."""
        return self.rl_weight == 0

    @property
    def mopd(self) -> bool:
        return self.form == "mopd"

    def route(self, value: Any, where: str = "") -> dict[str, float]:
        """The teachers (name -> weight) of a row whose routing column holds ``value``; a value no route
        and no teacher is named after is a :class:`UserError` naming it (``where``: which row)."""
        if self.identifier is None:
            return {t.name: t.weight for t in self.teachers}
        key = str(value)
        if key in self.routes:
            return dict(self.routes[key])
        by_name = {t.name: t for t in self.teachers}
        if key in by_name:
            return {key: by_name[key].weight}
        names = ", ".join(sorted(by_name))
        raise UserError(f"teacher: {where + ' has ' if where else ''}{self.identifier}={value!r}, which no teacher "
                        f"takes: the teachers are {names} and the routes {sorted(self.routes) or 'none'}. Add "
                        f"teacher.mopd.routes.{key}={{<teacher>: <weight>}} or a teacher named {key!r} "
                        f"(teacher.teachers.{key}.path=...), or fix the data's {self.identifier!r} column.")


def bind_distill(cfg, problems: list[str]) -> DistillSpec | None:
    """The bound ``teacher`` section of ``cfg`` (a ``TrainerConfig``), or None; rules that span sections
    are appended to ``problems``."""
    t = cfg.teacher
    if t is None:
        return None
    rl, distill = t.weights
    if t.pure and cfg.critic is not None:
        problems.append("teacher: pure distillation (RL weight 0) computes no reward and no returns, so the critic "
                        "would fit nothing: remove the critic section (critic=null) or give the RL loss a weight.")
    if t.teachers:
        teachers = tuple(TeacherSpec(n, f"teacher.teachers.{n}.path", m.path, m.dtype, float(m.weight))
                         for n, m in t.teachers.items())
    else:
        teachers = (TeacherSpec("teacher", "teacher.path", t.path, t.dtype),)
    return DistillSpec(
        form=t.form, rl_weight=float(rl), distill_weight=float(distill), teachers=teachers,
        ratio_cap=float(t.mopd.importance_ratio_cap), identifier=t.mopd.task_type_identifier if t.teachers else None,
        routes={k: dict(v) for k, v in t.mopd.routes.items()}, temperature=float(t.temperature), device=t.device,
        mb_spec=t.mb_spec, enable_tree_training=t.enable_tree_training, shard=bool(t.shard))


def wrap_loss(loss, spec: DistillSpec | None, actor):
    """The policy loss with the distillation term of ``spec`` (``loss`` itself without a teacher)."""
    if spec is None:
        return loss
    from ..loss import DistillLoss  # torch: not for the checks, which run before it loads

    return DistillLoss(rl=loss, form=spec.form, rl_weight=spec.rl_weight, distill_weight=spec.distill_weight,
                       ratio_cap=spec.ratio_cap, loss_agg_mode=actor.loss_agg_mode,
                       max_new_tokens=int(actor.max_new_tokens))


__all__ = ["DistillSpec", "TeacherSpec", "bind_distill", "wrap_loss"]
