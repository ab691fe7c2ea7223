"""What every environment adapter shares: its settings, the rows it gives, a score and how a number the
environment returns is checked, the one line that names a failure, and the message for a missing package.

An adapter (one module per ``environment.type``) is built by :func:`areal_trainer.environments.load` from
:class:`Settings` and offers:

* ``label``: ``"reasoning_gym:chain_sum"``, what messages and metrics name;
* ``multi_turn``: whether its episodes run as agents (tools, games) or its rows are scored once;
* ``verdict``: how the held-out accuracy reads its score (``reward.VERDICTS``), or None (accuracy only when
  every held-out score is 0 or 1);
* ``rows(split)``: the rows of ``"train"`` or ``"eval"`` (:class:`~areal_trainer.data.files.Row`, prompts as
  chat messages, with the column :data:`KEY` by which the adapter finds its task, entry or seed again);
* single-turn: ``async score(fields, completion) -> Score``;
* multi-turn: ``async episode(data, client, record) -> float | dict`` (``agent.py`` runs it).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..dtypes import fits_float32

KEY = "env_key"
"""The row column naming a row's task inside its environment: ``train/17``, ``eval/3``."""
SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Settings:
    """The ``environment`` section's values, handed to the adapters (which never read the config)."""

    type: str
    id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    split: str | None = None
    eval_split: str | None = None
    size: int | None = None
    eval_size: int = 100
    seed: int = 0
    eval_seed: int | None = None
    max_turns: int = 8
    system_prompt: str | None = None
    answer_tag: str | None = "answer"
    answer_pattern: str | None = None
    evaluate: bool = True
    """Whether the run evaluates (``valid_dataset`` set): a verifiers taskset then keeps held-out tasks back."""

    def seed_of(self, split: str, default_size: int) -> int:
        """The first seed of ``split``'s rows: ``seed``; held-out: ``eval_seed`` or ``seed + size``."""
        if split == "train":
            return self.seed
        return self.eval_seed if self.eval_seed is not None else self.seed + (self.size or default_size)


class EnvironmentFailure(Exception):
    """The environment itself failed (its ``reset``, ``step``, scoring or a task's setup raised, or it returned
    an unusable reward): counted (``env/errors`` or ``env/bad_rewards``) and named once, never the policy's
    doing. ``stage`` says where: ``reset``, ``step``, ``score``, ``setup``, ``reward``."""

    def __init__(self, stage: str, detail: str, *, bad_reward: bool = False):
        super().__init__(f"{stage}: {detail}")
        self.stage, self.detail, self.bad_reward = stage, detail, bad_reward


@dataclass
class Score:
    """The environment's score of one answer or episode: its reward (the weighted sum of its reward functions,
    or one number) and each named part (a verifiers reward function's own value, a metric), logged as
    ``env/<name>``."""

    reward: float
    parts: dict[str, float] = field(default_factory=dict)


def reward_value(value: Any, what: str) -> float:
    """``value`` as a reward, or :class:`EnvironmentFailure` (``bad_reward``) when it is not a finite number
    within float32 (``bool`` counts as 0/1; ``None`` is no number)."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real):
        raise EnvironmentFailure("reward", f"{what} returned {value!r:.100} ({type(value).__name__}), not a number",
                                 bad_reward=True)
    x = float(value)
    if not math.isfinite(x) or not fits_float32(x):
        raise EnvironmentFailure("reward", f"{what} returned {x!r}, not a finite float32 number", bad_reward=True)
    return x


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:600]}"


_WARNED: set[tuple[str, str]] = set()


def warn_once(label: str, what: str, message: str) -> None:
    """One line per environment and kind of failure for the whole run; later ones are only counted."""
    if (label, what) in _WARNED:
        return
    _WARNED.add((label, what))
    print(f"warning: environment {label}: {message}", file=sys.stderr, flush=True)


def text_of(content: Any) -> str:
    """A message's content as text: a string as it is; content parts (``[{"type": "text", "text": ...}]``)
    joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(getattr(p, "text", p))
                         for p in content)
    return "" if content is None else str(content)


def prompt_messages(system: str | None, prompt: Any) -> list[dict]:
    """Chat messages from an environment's system prompt and prompt (a text, or messages as dicts or pydantic
    models), the system message first when there is one and the prompt has none."""
    if isinstance(prompt, str) or prompt is None:
        messages = [{"role": "user", "content": prompt or ""}]
    else:
        messages = [_as_dict(m) for m in prompt]
    has_system = any(m.get("role") == "system" for m in messages)
    return ([{"role": "system", "content": system}] if system and not has_system else []) + messages


def _as_dict(message: Any) -> dict:
    m = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    return {**m, "content": text_of(m.get("content"))}
