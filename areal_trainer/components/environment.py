"""Binding ``environment.*`` once: the environment's package is installed, its id exists and its kwargs fit,
and it does not collide with the keys it replaces; all of it before any model loads. The light check (the
command line's, before Hydra) only looks for the package, without importing it.

What the bound environment replaces: the rows of ``train_dataset`` and ``valid_dataset`` (their ``path``,
``name``, ``split`` and ``max_rows`` are not read; ``valid_dataset=null`` still turns evaluation off), and, for a
single-turn environment, the reward (``reward.fn`` names the source ``environment``, its default with an
environment); a multi-turn one runs as an agent, so ``rollout.agent`` and a non-default ``rollout.workflow``
cannot be set with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..data.files import Row
from ..environments import EnvironmentFailure, Settings, load, missing
from ..environments.reward import NAME
from ..errors import UserError

DEFAULT_WORKFLOW = "areal_trainer.rollout.workflows.single_turn.RLVRWorkflow"
DEFAULT_DATA = "builtin:arith"


@dataclass(frozen=True)
class EnvironmentSpec:
    """A bound environment: its settings and its loaded adapter (``environments/``)."""

    settings: Settings
    adapter: Any

    @property
    def multi_turn(self) -> bool:
        return bool(self.adapter.multi_turn)

    @property
    def label(self) -> str:
        return self.adapter.label

    def rows(self, split: str) -> list[Row]:
        """The rows of ``"train"`` or ``"eval"``; a failure of the environment's own loading is a ``UserError``
        naming it (this runs when the trainer builds its data, still before any model loads)."""
        try:
            return self.adapter.rows(split)
        except EnvironmentFailure as e:
            raise UserError(f"environment {self.label}: {split} rows: {e}") from None


def settings_of(cfg) -> Settings:
    e = cfg.environment
    return Settings(type=e.type, id=e.id, kwargs=dict(e.kwargs), split=e.split, eval_split=e.eval_split, size=e.size,
                    eval_size=e.eval_size, seed=e.seed, eval_seed=e.eval_seed, max_turns=e.max_turns,
                    system_prompt=e.system_prompt, answer_tag=e.answer_tag, answer_pattern=e.answer_pattern,
                    evaluate=cfg.valid_dataset is not None)


def bind_environment(cfg, problems: list[str], *, light: bool = False) -> EnvironmentSpec | None:
    """The environment of ``cfg`` (None without one, or with problems, appended to ``problems``). ``light``:
    only whether its package is installed (nothing is imported)."""
    e = cfg.environment
    if e.type is None or e.check("environment"):
        if e.type is None and _names_environment(cfg):
            problems.append(f"reward.fn: names {NAME!r}, the scoring of an environment, but environment.type is null; "
                            "set environment.type and environment.id, or give reward functions.")
        return None
    n = len(problems)
    problems += _collisions(cfg)
    need = missing(e.type)
    if need:
        problems.append(need)
    if light or len(problems) > n:
        return None
    settings = settings_of(cfg)
    try:
        adapter = load(settings)
    except EnvironmentFailure as err:
        problems.append(f"environment.id={e.id!r} ({e.type}): {err.detail}")
        return None
    except Exception as err:  # noqa: BLE001 - the environment's package or the user's module raised on loading
        problems.append(f"environment.id={e.id!r} ({e.type}): loading it raised {type(err).__name__}: {err}")
        return None
    return EnvironmentSpec(settings, adapter)


def _names_environment(cfg) -> bool:
    return NAME in cfg.reward.paths() if cfg.reward.check("reward") == [] else False


def _collisions(cfg) -> list[str]:
    """Keys an environment replaces, set to something else."""
    p, r, t = [], cfg.rollout, cfg.environment.type
    if r.agent is not None:
        p.append(f"rollout.agent={r.agent!r} with environment.type={t}: the environment runs its own episodes; set "
                 "one of them.")
    if r.workflow != DEFAULT_WORKFLOW:
        p.append(f"rollout.workflow={r.workflow!r} with environment.type={t}: the environment's episodes run as the "
                 "single-turn workflow or as agents; leave rollout.workflow at its default.")
    for key in ("train_dataset", "valid_dataset"):
        d = getattr(cfg, key)
        if d is not None and d.path != DEFAULT_DATA:
            p.append(f"{key}.path={d.path!r} with environment.type={t}: the environment gives the rows, so "
                     f"{key}.path is not read; drop it (valid_dataset=null turns the held-out evaluation off).")
    paths = cfg.reward.paths() if isinstance(cfg.reward.fn, (str, list, tuple, type(None))) else []
    if NAME in paths and paths.index(NAME) != 0:
        p.append(f"reward.fn: {NAME!r} must come first in the list (reward.weights follow the sources in order: the "
                 "environment, then the functions, then the reward model, then the service).")
    return p
