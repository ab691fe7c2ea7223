"""Schema of ``teacher``: on-policy distillation, alone or mixed with RL (AReaL's ``TeacherConfig``
keys ``path``, ``dtype``, ``rl_loss_weight``, ``distill_loss_weight``), and several teachers routed by a
dataset column (MOPD, AReaL's ``feature/mopd`` branch: ``task_type_identifier``, ``rl_coefficient``,
``distillation_coefficient``, ``importance_ratio_cap``).

One teacher is ``teacher.path``; several are ``teacher.teachers.<name>.{path,dtype,weight}``. Every rule
is checked here at start-up, before any model loads (``docs/distillation.md`` explains the losses).
"""

from dataclasses import dataclass, field
from typing import Dict, Optional

from .base import Checked, is_number, number_in, one_of, suggest
from .parts import DTYPES, MicroBatchSpec

LOSS_FORMS = ("auto", "joint", "advantage", "mopd")
"""``joint``: AReaL's KD term added to the RL loss; ``advantage``: the per-token term added to the
advantages (slime, tinker); ``mopd``: the multi-teacher loss of reference §6.10; ``auto``: ``joint`` with
``teacher.path``, ``mopd`` with ``teacher.teachers``."""


@dataclass
class TeacherModelConfig(Checked):
    """One named teacher of MOPD (``teacher.teachers.<name>``)."""

    path: str = ""
    """The teacher's weights: a HF model directory or hub id, ``builtin:*``, or a checkpoint of this trainer
    (``.../checkpoints/step_<N>`` or its ``actor/`` directory, LoRA checkpoints included)."""
    dtype: str = "auto"
    """The teacher's weights' dtype (``auto``: float32 weights, bfloat16 autocast on CUDA)."""
    weight: float = 1.0
    """This teacher's weight ``w_j`` where a row is routed to it by name (> 0; not normalised)."""


@dataclass
class MOPDConfig:
    """``teacher.mopd``: the multi-teacher loss (reference §6.10; AReaL ``mopd.loss``)."""

    rl_coefficient: float = 0.0
    """Weight of the RL loss (0: pure distillation, no reward or GAE is computed)."""
    distillation_coefficient: float = 0.005
    """Weight of the MOPD distillation loss (not both 0 with ``rl_coefficient``)."""
    importance_ratio_cap: float = 5.0
    """Upper bound of the stop-gradient IS weight pi_theta / pi_behav of the distillation term (> 0)."""
    task_type_identifier: str = "task_type"
    """The dataset column whose value routes a row to its teachers."""
    routes: Dict[str, Dict[str, float]] = field(default_factory=dict)
    """Route value -> {teacher name: weight}; a value not listed goes to the teacher of the same name,
    with that teacher's ``weight``."""


@dataclass
class TeacherConfig(Checked):
    """On-policy distillation: a frozen teacher scores the student's own sampled tokens each step."""

    path: Optional[str] = None
    """One teacher (null with ``teachers``): a HF model directory or hub id, ``builtin:*``, or a checkpoint of
    this trainer (``.../checkpoints/step_<N>`` or its ``actor/`` directory, LoRA checkpoints included)."""
    dtype: str = "auto"
    """The teacher's weights' dtype (``auto``: float32 weights, bfloat16 autocast on CUDA)."""
    rl_loss_weight: float = 1.0
    """Weight of the RL loss (``joint``) or of the RL advantages (``advantage``); 0 = pure distillation:
    no reward and no GAE are computed."""
    distill_loss_weight: float = 0.005
    """Weight of the distillation term: the KD loss (``joint``) or beta of ``A += -beta (log pi - log pi_T)``
    (``advantage``; slime and tinker use about 1)."""
    loss_form: str = "auto"
    """``joint`` (AReaL), ``advantage`` (slime, tinker), ``mopd``, or ``auto`` (``joint`` with ``path``,
    ``mopd`` with ``teachers``); see docs/distillation.md."""
    teachers: Dict[str, TeacherModelConfig] = field(default_factory=dict)
    """MOPD: named teachers, each row routed by ``mopd.task_type_identifier`` (instead of ``path``)."""
    mopd: MOPDConfig = field(default_factory=MOPDConfig)
    temperature: float = 1.0
    """Logits of the teacher's forward are divided by this (1: the teacher's own distribution)."""
    device: Optional[str] = None
    """Where the teacher runs: null = the trainer's device, or ``cpu``, ``cuda``, ``cuda:1``."""
    shard: bool = True
    """Under FSDP2 (``parallel.fsdp``): shard the teacher like the policy, so that each process holds only
    its share of the weights and every forward gathers one block at a time (false: every process holds
    the whole teacher, with no communication). A teacher on ``teacher.device`` is never sharded."""
    mb_spec: MicroBatchSpec = field(default_factory=MicroBatchSpec)
    """Micro-batches of the teacher's forward (memory only)."""
    enable_tree_training: Optional[bool] = None
    """Shared-prefix forward of the teacher (null: where its attention supports it)."""

    # -- what the rest of the configuration reads ------------------------------------------------
    @property
    def form(self) -> str:
        """The loss form ``auto`` resolves to."""
        if self.loss_form != "auto":
            return self.loss_form
        return "mopd" if self.teachers else "joint"

    @property
    def weights(self) -> tuple[float, float]:
        """(RL weight, distillation weight) of the form in use, with the keys they come from."""
        if self.form == "mopd":
            return self.mopd.rl_coefficient, self.mopd.distillation_coefficient
        return self.rl_loss_weight, self.distill_loss_weight

    @property
    def pure(self) -> bool:
        """Pure distillation: the RL weight is 0, so no reward and no advantage estimation run."""
        return self.weights[0] == 0

    def model_paths(self, key: str = "teacher") -> list[tuple[str, str]]:
        """``(key, path)`` of every teacher."""
        if self.teachers:
            return [(f"{key}.teachers.{n}.path", t.path) for n, t in self.teachers.items()]
        return [] if self.path is None else [(f"{key}.path", self.path)]

    def check(self, key: str) -> list[str]:
        p = one_of(f"{key}.loss_form", self.loss_form, LOSS_FORMS)
        p += one_of(f"{key}.dtype", self.dtype, DTYPES)
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            p.append(f"{key}.path: got {self.path!r}; give a model directory, a checkpoint, a hub id or builtin:*.")
        if self.path is not None and self.teachers:
            p.append(f"{key}.path and {key}.teachers are both set: give one teacher as {key}.path, or several "
                     f"(MOPD) as {key}.teachers.<name>.path; set the other to null / {{}}.")
        if self.path is None and not self.teachers:
            p.append(f"{key}: no teacher: set {key}.path=<model> (one teacher) or {key}.teachers.<name>.path=<model> "
                     f"(several, MOPD), or remove the section ({key}=null).")
        p += number_in(f"{key}.temperature", self.temperature, 0, open_low=True)
        if self.device is not None and not (self.device in ("cpu", "cuda") or str(self.device).startswith("cuda:")):
            p.append(f"{key}.device: got {self.device!r}; use null (the trainer's device), cpu, cuda or cuda:<index>.")
        if self.form in ("joint", "advantage") and self.teachers:
            p.append(f"{key}.loss_form={self.loss_form!r} takes one teacher ({key}.path); {key}.teachers holds "
                     f"{len(self.teachers)}: use loss_form=mopd (or auto).")
        return p + self._weight_problems(key) + self._teachers_problems(key)

    def _weight_problems(self, key: str) -> list[str]:
        if self.form == "mopd":
            names = (f"{key}.mopd.rl_coefficient", f"{key}.mopd.distillation_coefficient")
            other = (f"{key}.rl_loss_weight", self.rl_loss_weight, 1.0), (f"{key}.distill_loss_weight",
                                                                         self.distill_loss_weight, 0.005)
        else:
            names = (f"{key}.rl_loss_weight", f"{key}.distill_loss_weight")
            other = ()
        p = []
        for name, value in zip(names, self.weights):
            p += number_in(name, value, 0, finite=True)
        if all(is_number(v) for v in self.weights) and self.weights == (0, 0):
            p.append(f"{names[0]} and {names[1]} are both 0: nothing would be trained. Set {names[1]} > 0 "
                     f"(distillation) or {names[0]} > 0 (RL).")
        for name, value, default in other:
            if value != default:
                p.append(f"{name}={value!r} weighs the single-teacher forms; with MOPD the weights are "
                         f"{names[0]} and {names[1]}: set those instead.")
        if self.form == "mopd":
            p += number_in(f"{key}.mopd.importance_ratio_cap", self.mopd.importance_ratio_cap, 0, open_low=True,
                           finite=True, note="AReaL: 5.0")
        return p

    def _teachers_problems(self, key: str) -> list[str]:
        p = []
        for name, t in self.teachers.items():
            k = f"{key}.teachers.{name}"
            if not isinstance(t.path, str) or not t.path:
                p.append(f"{k}.path: got {t.path!r}; give the teacher's model directory, checkpoint or hub id.")
            p += one_of(f"{k}.dtype", t.dtype, DTYPES)
            p += number_in(f"{k}.weight", t.weight, 0, open_low=True, finite=True,
                           note="remove a teacher you do not want to use")
        m = self.mopd
        if self.form == "mopd" and self.teachers:
            if not isinstance(m.task_type_identifier, str) or not m.task_type_identifier:
                p.append(f"{key}.mopd.task_type_identifier: got {m.task_type_identifier!r}; name the dataset column "
                         "that routes a row (AReaL: task_type).")
            for route, mix in m.routes.items():
                if not mix:
                    p.append(f"{key}.mopd.routes.{route}: empty; map it to at least one teacher, e.g. "
                             f"{{{next(iter(self.teachers))}: 1.0}}.")
                for name, w in mix.items():
                    if name not in self.teachers:
                        p.append(f"{key}.mopd.routes.{route}.{name}: no teacher is named {name!r}; the teachers are "
                                 f"{', '.join(sorted(self.teachers))} ({key}.teachers.<name>)."
                                 f"{suggest(name, self.teachers)}")
                    p += number_in(f"{key}.mopd.routes.{route}.{name}", w, 0, open_low=True, finite=True)
        return p

    def warnings(self, key: str) -> list[str]:
        w = []
        if self.form != "mopd" and (self.mopd.rl_coefficient, self.mopd.distillation_coefficient,
                                    self.mopd.importance_ratio_cap, dict(self.mopd.routes)) != (0.0, 0.005, 5.0, {}):
            w.append(f"{key}.mopd.* is set but the loss form is {self.form!r}: it has no effect (MOPD needs "
                     f"{key}.teachers or {key}.loss_form=mopd).")
        return w
