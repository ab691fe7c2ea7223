"""``rollout.agent`` resolved and checked: what to call, in which form, and with which kwargs.

The contract (docs/agents.md): an async function, or a class whose instances have a ``run`` method (the
class is built once with ``rollout.agent_kwargs``; a function gets them with every call), called as
``run(data, *, client)`` or ``run(data, *, base_url, api_key)``, whichever parameters it declares. A plain
``def run`` runs in a worker thread. Checked once, at start-up, so that a wrong agent is reported before
any model loads, naming the key and the fix.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any

from ...plugins import PluginError, import_object


@dataclass(frozen=True)
class AgentSpec:
    """A resolved ``rollout.agent``: what to call, how (``client`` or ``http``), and whether it is async."""

    path: str
    target: Any
    """The function, or the class (instantiated when the workflow is built)."""
    is_class: bool
    style: str
    """``client``: ``run(data, *, client)``; ``http``: ``run(data, *, base_url, api_key)``."""
    is_async: bool
    kwargs: dict


def _run_of(target: Any, is_class: bool) -> Any:
    return getattr(target, "run", None) if is_class else target


def load_agent(path: Any, kwargs: dict, key: str = "rollout.agent") -> AgentSpec:
    """Resolve and check ``rollout.agent``; raises :class:`PluginError` naming the key and the fix."""
    target = import_object(path, key)
    is_class = inspect.isclass(target)
    run = _run_of(target, is_class)
    shape = ("an async function run(data, *, client) (or run(data, *, base_url, api_key)), or a class with such a "
             "run method")
    if not callable(run):
        what = "a class without a run method" if is_class else f"a {type(target).__name__}"
        raise PluginError(f"{key}: {path!r} is {what}; it must be {shape}.")
    try:
        params = inspect.signature(run).parameters
    except (TypeError, ValueError) as e:
        raise PluginError(f"{key}: the signature of {path!r} cannot be read ({e}); it must be {shape}.") from e
    names = set(params)
    if "client" in names:
        style = "client"
    elif {"base_url", "api_key"} <= names:
        style = "http"
    else:
        raise PluginError(f"{key}: {path!r} takes ({', '.join(params)}); it must take data and either client or "
                          f"base_url and api_key as keyword arguments: {shape}.")
    positional = [p for n, p in params.items()
                  if n != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional and not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        raise PluginError(f"{key}: {path!r} has no parameter for the dataset row; it must be {shape}.")
    if is_class:
        try:
            inspect.signature(target).bind(**kwargs)
        except TypeError as e:
            raise PluginError(f"{key}: rollout.agent_kwargs {sorted(kwargs)} do not fit {path}({e}).") from e
    else:
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        unknown = [k for k in kwargs if k not in names and not takes_any]
        if unknown:
            raise PluginError(f"rollout.agent_kwargs: {', '.join(unknown)} are not parameters of {path!r} "
                              f"(it takes {', '.join(params)}).")
    is_async = inspect.iscoroutinefunction(run)
    return AgentSpec(str(path), target, is_class, style, is_async, dict(kwargs))


async def call_agent(spec: AgentSpec, instance: Any, data: dict, **kwargs: Any) -> Any:
    """One episode: ``run(data, **kwargs)`` of ``instance`` (a class agent's) or of the function, which also gets
    ``rollout.agent_kwargs``; a plain ``def run`` in a worker thread of the running loop."""
    run = instance.run if instance is not None else spec.target
    own = {} if spec.is_class else spec.kwargs
    if spec.is_async:
        return await run(data, **kwargs, **own)
    return await asyncio.to_thread(run, data, **kwargs, **own)


def close_method(instance: Any) -> Any:
    """The agent instance's ``close`` (or ``aclose``), called once when the run ends; None without one."""
    close = getattr(instance, "close", None) or getattr(instance, "aclose", None)
    return close if callable(close) else None
