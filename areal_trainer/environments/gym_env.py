"""Gymnasium environments (``environment.type=gym``): text games played as agent episodes (``turns.py``).

``environment.id`` is a registered id (``GuessNumber-v0``; ``module:GuessNumber-v0`` imports ``module`` first,
which registers it) made with ``gymnasium.make(id, **environment.kwargs)``, or an environment class
``module.Class`` built as ``Class(**environment.kwargs)``. One environment per episode: ``reset(seed=s)`` with
the row's seed (training row ``i``: ``environment.seed + i``; held-out rows from ``environment.eval_seed``),
``step(action) -> (observation, reward, terminated, truncated, info)``; the episode ends at ``terminated`` or
``truncated``. A row's prompt is the observation of its seed's ``reset``, and its columns the text and
number values of that ``reset``'s ``info`` (``turns.game_rows``: a ``demonstration`` there is what the warm
start of a built-in model imitates).

Text in and out. An observation is the next user message: a string as it is (``spaces.Text``), anything else
as ``str()``. An answer is the action: the text itself for a ``spaces.Text`` action space, its last integer for
a ``spaces.Discrete`` one (none, or one out of range, is an invalid action); other action spaces are refused at
start-up. The system message is ``environment.system_prompt``.
"""

from __future__ import annotations

import asyncio
import importlib
import re
from typing import Any

from ..data.files import Row
from ..errors import suggest
from .base import EnvironmentFailure, Settings, describe
from .turns import InvalidAction, Step, game_rows, play

DEFAULT_SIZE = 1000
_INT = re.compile(r"-?\d+")


class GymEnvironment:
    multi_turn = True
    verdict = None

    def __init__(self, settings: Settings):
        import gymnasium
        from gymnasium import spaces

        self.settings, self.label, self.gym = settings, f"gym:{settings.id}", gymnasium
        self.make = self._maker(settings.id)
        try:
            probe = self.make()
        except EnvironmentFailure:
            raise
        except Exception as e:  # noqa: BLE001 - the environment's constructor, with the user's kwargs
            raise EnvironmentFailure("id", f"making {settings.id!r} with environment.kwargs={dict(settings.kwargs)} "
                                           f"raised {describe(e)}") from e
        space = probe.action_space
        probe.close()
        if isinstance(space, spaces.Text):
            self.discrete = None
        elif isinstance(space, spaces.Discrete):
            self.discrete = (int(space.start), int(space.start) + int(space.n))
        else:
            raise EnvironmentFailure("id", f"its action space is {space}; a model's answer is text, so the action "
                                           "space must be spaces.Text (the answer is the action) or spaces.Discrete "
                                           "(the answer's last integer)")

    def _maker(self, ident: str):
        gym, kwargs = self.gym, dict(self.settings.kwargs)
        module, _, name = ident.partition(":") if ":" in ident else ("", "", ident)
        if module:
            try:
                importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 - the user's module
                raise EnvironmentFailure("id", f"importing {module!r} (from {ident!r}) raised {describe(e)}") from e
        if name in gym.registry:
            return lambda: gym.make(name, **kwargs)
        cls = _class(name) if "." in name and not module else None
        if cls is not None:
            return lambda: cls(**kwargs)
        ids = sorted(gym.registry)
        raise EnvironmentFailure("id", f"no Gymnasium environment {ident!r}.{suggest(name, ids)} Registered: "
                                       f"{', '.join(ids)}. Give a registered id, module:Id-v0 (the module registers "
                                       "it), or module.Class.")

    def rows(self, split: str) -> list[Row]:
        return game_rows(self, split, DEFAULT_SIZE)

    def first_observation(self, seed: int) -> tuple[str, dict]:
        """The observation of ``reset(seed=seed)``, and its ``info``'s text and number values as row columns."""
        env = self.make()
        try:
            obs, info = env.reset(seed=seed)
        finally:
            env.close()
        simple = (str, int, float, bool)
        return _text(obs), {k: v for k, v in dict(info or {}).items() if isinstance(k, str) and isinstance(v, simple)}

    async def episode(self, data: dict, client: Any, record: Any) -> dict[str, float]:
        system = self.settings.system_prompt or None
        return await play(self, data, client, record, max_turns=self.settings.max_turns, system=system,
                          label=self.label)

    # -- the game, as turns.py plays it ----------------------------------------------------------------
    async def start(self, seed: int) -> tuple[Any, str]:
        env = await asyncio.to_thread(self.make)
        obs, _info = await asyncio.to_thread(env.reset, seed=seed)
        return env, _text(obs)

    def action(self, text: str) -> Any:
        if self.discrete is None:
            return text
        found = _INT.findall(text)
        if not found or not self.discrete[0] <= int(found[-1]) < self.discrete[1]:
            raise InvalidAction(text)
        return int(found[-1])

    async def step(self, env: Any, action: Any) -> Step:
        obs, reward, terminated, truncated, _info = await asyncio.to_thread(env.step, action)
        return Step(_text(obs), reward, bool(terminated or truncated))

    async def close(self, env: Any) -> None:
        await asyncio.to_thread(env.close)


def _text(obs: Any) -> str:
    return obs if isinstance(obs, str) else str(obs)


def _class(path: str):
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None
