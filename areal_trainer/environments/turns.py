"""A turn-based game as an agent episode, for the environments that step on text (Gymnasium, OpenEnv): the
observation of ``reset`` is the first user message, each answer of the model is an action, each observation
after it the next user message, until the game ends or ``environment.max_turns`` answers were given.

A *game* (``gym_env.GymGame``, ``openenv_env.OpenEnvGame``) offers ``async start(seed) -> (handle, text)``,
``action(text) -> action`` (raising :class:`InvalidAction` when the answer is no action of the game),
``async step(handle, action) -> Step`` and ``async close(handle)``.

Rewards. Each step's reward goes to the model call that chose its action (``{completion_id: reward}``), so the
episode's return is the step rewards summed with ``rollout.turn_discount`` (``rollout/agents/trajectory.py``).
An answer that is no action of the game ends the episode with 0 for that call (``env/invalid_actions``): it is
the policy's doing. A request that leaves no room for an answer ends it too (``agent/length_refusals``). An
episode still running after ``max_turns`` answers ends there, with the rewards it earned
(``env/turn_limits``). ``reset`` or ``step`` raising, or a reward that is not a finite number, is the
environment's failure (:class:`~areal_trainer.environments.base.EnvironmentFailure`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..data.files import Row
from .base import KEY, EnvironmentFailure, describe, reward_value

SEED = "env_seed"
"""The row column with the episode's seed (``reset(seed=...)``)."""


def game_rows(game: Any, split: str, default_size: int) -> list[Row]:
    """One row per episode seed of ``split`` (training row ``i``: ``environment.seed + i``; held-out rows from
    ``environment.eval_seed``). Its prompt is the system message and the observation of ``reset`` with its seed
    (``game.first_observation``: the text, and the columns the game gives the row, e.g. the text and number
    values of Gymnasium's reset ``info``: a ``demonstration`` for the warm start, an ``answer``); where that
    raises (the episode will fail and be counted when it runs) or a server's episodes only start when they run,
    a stand-in naming the seed. An episode's own ``reset`` gives its first message."""
    s = game.settings
    first = s.seed_of(split, default_size)
    n = (s.size or default_size) if split == "train" else s.eval_size
    system = [{"role": "system", "content": s.system_prompt}] if s.system_prompt else []
    rows = []
    for i in range(n):
        try:
            text, columns = game.first_observation(first + i)
        except Exception:  # noqa: BLE001 - counted when the episode runs; the row keeps its place
            text, columns = f"Episode {first + i}.", {}
        own = {"prompt": [*system, {"role": "user", "content": text}], KEY: f"{split}/{i}", SEED: first + i}
        rows.append(Row({**columns, **own}, f"episode {i} (seed {first + i}) of {game.label} ({split})"))
    return rows


class InvalidAction(ValueError):
    """The model's answer is not an action of the game (e.g. no number for a ``Discrete`` action space)."""


@dataclass
class Step:
    text: str
    reward: float
    done: bool
    parts: dict[str, float] = field(default_factory=dict)


async def play(game: Any, data: dict, client: Any, record: Any, *, max_turns: int, system: str | None,
               label: str) -> dict[str, float]:
    """One episode (see the module docstring); the reward of each model call, by completion id."""
    seed = data.get(SEED)
    if not isinstance(seed, int):
        raise EnvironmentFailure("reset", f"row {data.get(KEY)!r} has no episode seed")
    try:
        handle, first = await game.start(seed)
    except EnvironmentFailure:
        raise
    except Exception as e:  # noqa: BLE001 - the environment's own reset
        raise EnvironmentFailure("reset", f"reset(seed={seed}) raised {describe(e)}") from e
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": first}]
    rewards: dict[str, float] = {}
    try:
        for turn in range(max_turns):
            reply = await client.chat.completions.create(model="policy", messages=messages)
            choice = reply.choices[0]
            text = choice.message.content or ""
            if choice.finish_reason == "length" and not text:
                break  # no room left for an answer: nothing was sampled
            try:
                action = game.action(text)
            except InvalidAction:
                record.invalid_actions += 1
                rewards[reply.id] = 0.0
                break
            try:
                step = await game.step(handle, action)
            except EnvironmentFailure:
                raise
            except Exception as e:  # noqa: BLE001 - the environment's own step
                raise EnvironmentFailure("step", f"step({text[:60]!r}) raised {describe(e)}") from e
            rewards[reply.id] = reward_value(step.reward, "step")
            for name, value in step.parts.items():
                record.parts[name] = record.parts.get(name, 0.0) + reward_value(value, name)
            if step.done:
                break
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": step.text}]
            if turn == max_turns - 1:
                record.turn_limit = True
    finally:
        try:
            await game.close(handle)
        except Exception:  # noqa: BLE001,S110 - closing a finished game cannot change its rewards
            pass
    record.parts.setdefault("return", sum(rewards.values()))
    return rewards
