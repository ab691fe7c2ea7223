"""Training on an environment from a hub (the ``environment`` section): a verifiers taskset, a reasoning-gym
task, a Gymnasium environment or an OpenEnv environment. The environment gives the prompts, the tools and
the turns, and scores the answers itself; binding it (importing the package, finding the id, checking the
kwargs) is ``components/environment.py``; the adapters are ``areal_trainer/environments/``. docs/environments.md
has the whole story."""

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .base import Checked, at_least_one, integer_at_least, one_of

TYPES = ("verifiers", "reasoning_gym", "gym", "openenv")
"""The values of ``environment.type`` (null: no environment; the datasets and ``reward.fn`` make the task)."""
@dataclass
class EnvironmentConfig(Checked):
    """An environment as the task: its prompts (and tools, and turns) and its own scoring replace
    ``train_dataset.path`` / ``valid_dataset.path`` and ``reward.fn``. Single-turn tasks (reasoning-gym; a
    verifiers taskset without tools) become dataset rows scored by the environment (``reward.fn`` names it
    ``environment``); multi-turn ones (a verifiers taskset with tools, Gymnasium and OpenEnv games) run as
    agent episodes of at most ``max_turns`` model calls."""

    type: Optional[str] = None
    """``verifiers``, ``reasoning_gym``, ``gym`` or ``openenv`` (null: no environment). Each needs its package:
    ``pip install -e '.[envs]'`` (all of them) or one extra: ``envs-verifiers``, ``envs-reasoning-gym``,
    ``envs-gym``, ``envs-openenv``."""
    id: Optional[str] = None
    """What to load: a verifiers taskset id or module (exporting its ``Taskset`` subclass in ``__all__``, or
    an older module-level ``load_environment``); a reasoning-gym task name (``chain_sum``); a Gymnasium id
    (``module:Name-v0`` imports ``module`` first) or ``module.Class``; an OpenEnv environment class
    (``module.Class``) or the URL of a running OpenEnv server."""
    kwargs: Dict[str, Any] = field(default_factory=dict)
    """Passed to the environment: the verifiers taskset's config fields, reasoning-gym's task config
    (``min_digits``...), ``gymnasium.make``'s keyword arguments, the OpenEnv class's constructor."""
    split: Optional[str] = None
    """verifiers: the training split, for a taskset whose config has a ``split`` field (null: its default)."""
    eval_split: Optional[str] = None
    """verifiers: the held-out split (a ``split`` field's value). null: the held-out tasks are the
    ``eval_size`` tasks after the training ones, of the same split."""
    size: Optional[int] = None
    """Training rows: reasoning-gym problems, Gymnasium/OpenEnv episodes (one seed each), verifiers tasks
    (null: 1000 generated; every task of the split but the held-out ones)."""
    eval_size: int = 100
    """Held-out rows (problems, episodes or tasks), when ``valid_dataset`` is set."""
    seed: int = 0
    """The environment's seed: reasoning-gym's dataset seed; the first episode seed of Gymnasium/OpenEnv rows
    (row ``i`` resets with ``seed + i``); verifiers: unused."""
    eval_seed: Optional[int] = None
    """The held-out seed (null: ``seed + size``, so Gymnasium/OpenEnv held-out episodes never repeat a
    training seed)."""
    max_turns: int = 8
    """Most model calls of a multi-turn episode (tool calls answered, or game steps); an episode that reaches
    it ends there, scored as it stands, and is counted (``env/turn_limits``)."""
    system_prompt: Optional[str] = None
    """The system message of every prompt (null: the environment's own, e.g. a verifiers task's
    ``system_prompt`` or reasoning-gym's default answer-format instruction; '' = none)."""
    answer_tag: Optional[str] = "answer"
    """reasoning-gym: the tag whose last ``<tag>...</tag>`` in the answer is what ``score_answer`` scores, as
    reasoning-gym's own evaluations extract it (null: the whole answer, stripped)."""
    answer_pattern: Optional[str] = None
    """reasoning-gym: a regular expression whose last match in the answer (its first group, if it has one) is
    what ``score_answer`` scores, in place of ``answer_tag`` (e.g. ``-?\\d+``: the last integer written; no
    match scores 0). null: ``answer_tag`` decides."""

    def check(self, key: str) -> list[str]:
        if self.type is None:
            set_ = [k for k in ("id", "split", "eval_split", "size", "eval_seed") if getattr(self, k) is not None]
            return [f"{key}.{k}: set while {key}.type is null; set {key}.type to one of {', '.join(TYPES)} (or drop "
                    f"{key}.{k})." for k in set_ + (["kwargs"] if self.kwargs else [])]
        p = one_of(f"{key}.type", self.type, TYPES)
        if not isinstance(self.id, str) or not self.id.strip():
            p.append(f"{key}.id: {key}.type={self.type} needs the environment to load, e.g. "
                     f"{key}.id={_EXAMPLES.get(self.type, 'chain_sum')}.")
        p += at_least_one(f"{key}.size", self.size, nullable=True)
        p += at_least_one(f"{key}.eval_size", self.eval_size)
        p += at_least_one(f"{key}.max_turns", self.max_turns)
        p += integer_at_least(f"{key}.seed", self.seed, 0)
        p += integer_at_least(f"{key}.eval_seed", self.eval_seed, 0, nullable=True)
        if self.answer_pattern is not None:
            try:
                re.compile(self.answer_pattern)
            except (re.error, TypeError) as e:
                p.append(f"{key}.answer_pattern: got {self.answer_pattern!r}, not a regular expression ({e}).")
        if self.type in ("reasoning_gym", "gym", "openenv"):
            p += [f"{key}.{k}: {key}.type={self.type} has no splits; the held-out rows come from "
                  f"{key}.eval_seed. Drop {key}.{k}." for k in ("split", "eval_split") if getattr(self, k) is not None]
        return p


_EXAMPLES = {"verifiers": "my_taskset", "reasoning_gym": "chain_sum", "gym": "my_games:GuessNumber-v0",
             "openenv": "my_envs.EchoEnvironment"}
