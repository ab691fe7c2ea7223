"""OpenEnv environments (``environment.type=openenv``, the ``openenv-core`` package): typed ``reset``/``step``
servers, played as agent episodes (``turns.py``).

``environment.id`` is an environment class ``module.Class`` (an ``openenv.core.Environment`` subclass, built
as ``Class(**environment.kwargs)`` for every episode and run in this process) or the URL of a running OpenEnv
server (``http://host:port``; each episode is a WebSocket session of its own, through OpenEnv's
``GenericEnvClient``; the action schema is read from the server's ``/schema`` at start-up). Episodes reset with
the row's seed (``reset(seed=s)``); each observation's ``reward`` (None: 0) is the step's reward and its
``done`` ends the episode.

Text in and out. An observation is the next user message: its text when its only field besides ``done``,
``reward`` and ``metadata`` is a text, else those fields as JSON. An answer is the action: the value of the
action's one required text field when it has exactly one, else a JSON object of the action's fields (an answer
that is not one is an invalid action). A class environment's rubric (``env.rubric``) adds each named rubric's
last score as a part (``env/<name>``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import typing
from typing import Any

from ..data.files import Row
from ..errors import suggest
from .base import EnvironmentFailure, Settings, describe
from .turns import InvalidAction, Step, game_rows, play

DEFAULT_SIZE = 1000
BASE_FIELDS = ("done", "reward", "metadata")


class OpenEnvEnvironment:
    multi_turn = True
    verdict = None

    def __init__(self, settings: Settings):
        self.settings, self.label = settings, f"openenv:{settings.id}"
        self.url = settings.id.rstrip("/") if settings.id.startswith(("http://", "https://")) else None
        if self.url is not None:
            self.cls, self.action_schema = None, _schema(self.url)
            self.text_field = _text_field(self.action_schema)
            return
        from openenv.core.env_server.interfaces import Environment

        self.cls = _environment_class(settings.id, Environment)
        self.action_cls = _action_class(self.cls)
        self.action_schema = self.action_cls.model_json_schema()
        try:
            inspect.signature(self.cls).bind(**dict(settings.kwargs))
        except TypeError as e:
            raise EnvironmentFailure("id", f"environment.kwargs {sorted(settings.kwargs)} do not fit "
                                           f"{settings.id}{inspect.signature(self.cls)}: {e}") from e
        self.text_field = _text_field(self.action_schema)

    def rows(self, split: str) -> list[Row]:
        return game_rows(self, split, DEFAULT_SIZE)

    def first_observation(self, seed: int) -> tuple[str, dict]:
        if self.url is not None:
            raise EnvironmentFailure("reset", "a server's episodes start when they run")
        env = self.cls(**dict(self.settings.kwargs))
        try:
            return _text(env.reset(seed=seed)), {}
        finally:
            close = getattr(env, "close", None)
            if callable(close) and not inspect.iscoroutinefunction(close):
                close()

    async def episode(self, data: dict, client: Any, record: Any) -> dict[str, float]:
        return await play(self, data, client, record, max_turns=self.settings.max_turns,
                          system=self.settings.system_prompt or None, label=self.label)

    # -- the game, as turns.py plays it ----------------------------------------------------------------
    async def start(self, seed: int) -> tuple[Any, str]:
        if self.url is not None:
            from openenv.core.generic_client import GenericEnvClient

            env = GenericEnvClient(base_url=self.url)
            await env.connect()
            result = await env.reset(seed=seed)
            return env, _text(result.observation)
        env = self.cls(**dict(self.settings.kwargs))
        obs = await _call(env, "reset", seed=seed)
        return env, _text(obs)

    def action(self, text: str) -> Any:
        if self.text_field is not None:
            values = {self.text_field: text}
        else:
            try:
                values = json.loads(text.strip())
            except json.JSONDecodeError as e:
                raise InvalidAction(text) from e
            if not isinstance(values, dict):
                raise InvalidAction(text)
        if self.url is not None:
            return values
        try:
            return self.action_cls.model_validate(values)
        except Exception as e:  # noqa: BLE001 - pydantic's ValidationError: the answer is no action
            raise InvalidAction(text) from e

    async def step(self, env: Any, action: Any) -> Step:
        if self.url is not None:
            result = await env.step(action)
            return Step(_text(result.observation), 0.0 if result.reward is None else result.reward, bool(result.done))
        obs = await _call(env, "step", action)
        parts = {}
        rubric = getattr(env, "rubric", None)
        if rubric is not None and hasattr(rubric, "named_rubrics"):
            parts = {name or "rubric": r.last_score for name, r in rubric.named_rubrics() if r.last_score is not None}
        return Step(_text(obs), 0.0 if obs.reward is None else obs.reward, bool(obs.done), parts)

    async def close(self, env: Any) -> None:
        close = getattr(env, "close", None)
        if close is not None:
            result = close()
            if inspect.isawaitable(result):
                await result


async def _call(env: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``env.<name>_async`` when the class has its own, else the plain method (in a thread: it may block)."""
    import asyncio

    from openenv.core.env_server.interfaces import Environment

    own_async = getattr(type(env), f"{name}_async", None) is not getattr(Environment, f"{name}_async", None)
    if own_async:
        return await getattr(env, f"{name}_async")(*args, **kwargs)
    return await asyncio.to_thread(getattr(env, name), *args, **kwargs)


def _text(obs: Any) -> str:
    """An observation (a pydantic model or the dict a server sends) as the model's next message."""
    values = obs.model_dump() if hasattr(obs, "model_dump") else dict(obs or {})
    rest = {k: v for k, v in values.items() if k not in BASE_FIELDS}
    only = list(rest.values())
    return only[0] if len(only) == 1 and isinstance(only[0], str) else json.dumps(rest, default=str)


def _text_field(schema: dict) -> str | None:
    """The action's one required text field, or None (the answer is then the action as JSON)."""
    props = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    required = [k for k in schema.get("required", []) if k in props]
    texts = [k for k in required if props[k].get("type") == "string"]
    return texts[0] if len(required) == 1 and texts else None


def _environment_class(path: str, base: type) -> type:
    module, _, attr = path.rpartition(".")
    if ":" in path:
        module, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module, or one not installed
        raise EnvironmentFailure("id", f"cannot import {module!r} (from {path!r}): {describe(e)}. Give an "
                                       "OpenEnv environment class as module.Class, or a server's URL "
                                       "(http://host:port).") from e
    cls = getattr(mod, attr, None)
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        found = [n for n, v in vars(mod).items() if inspect.isclass(v) and issubclass(v, base) and v is not base]
        what = "has no attribute" if cls is None else "is not an openenv.core.Environment subclass:"
        raise EnvironmentFailure("id", f"{module!r} {what} {attr!r}.{suggest(attr, found)} Its environment "
                                       f"classes: {', '.join(found) or 'none'}.")
    return cls


def _action_class(cls: type) -> type:
    """The action type of an environment class: its ``step``'s annotation, else its generic parameter."""
    from openenv.core.env_server.types import Action

    try:
        hint = typing.get_type_hints(cls.step).get("action")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: look at the generic bases
        hint = None
    if inspect.isclass(hint) and issubclass(hint, Action):
        return hint
    for base in getattr(cls, "__orig_bases__", ()):
        for arg in typing.get_args(base):
            if inspect.isclass(arg) and issubclass(arg, Action):
                return arg
    raise EnvironmentFailure("id", f"{cls.__name__}.step takes no Action subclass (annotate its action parameter)")


def _schema(url: str) -> dict:
    import httpx

    try:
        response = httpx.get(f"{url}/schema", timeout=10.0)
        response.raise_for_status()
        return dict(response.json().get("action") or {})
    except Exception as e:  # noqa: BLE001 - no server there, or not an OpenEnv one
        raise EnvironmentFailure("id", f"no OpenEnv server answers at {url} (GET {url}/schema: {describe(e)}); "
                                       "start it first, or give an environment class as module.Class") from e
