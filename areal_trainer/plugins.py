"""Resolve user functions given as import paths (``package.module.function``) once, at start-up.

Each failure mode has its own message, naming the config key: the module does not exist, the
module raised while importing (the original exception is chained), the attribute is missing
(listing what the module does offer), the object is not callable, or the configured kwargs do
not fit its signature.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .errors import suggest


class PluginError(ValueError):
    """A user function could not be resolved or bound; the message names the config key."""


def import_object(path: str, key: str) -> Any:
    """Import ``package.module.attr`` (a ``package.module:attr`` form is accepted too)."""
    if not isinstance(path, str) or not path.strip():
        raise PluginError(f"{key}: got {path!r}; give an import path 'package.module.function'.")
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise PluginError(f"{key}: {path!r} is not an import path; write 'package.module.function'.")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise PluginError(f"{key}: module {module_name!r} not found (from {path!r}); is it installed or on "
                              "PYTHONPATH? Run from the directory that contains it, or `pip install -e` it.") from e
        raise PluginError(f"{key}: importing {module_name!r} failed inside your module: {e}") from e
    except Exception as e:  # noqa: BLE001 - any error inside the user's module is reported as such
        raise PluginError(f"{key}: importing {module_name!r} raised {type(e).__name__}: {e} "
                          "(the error is inside that module; see the chained traceback).") from e
    if not hasattr(module, attr):
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        hint = suggest(attr, public) or f" It offers: {', '.join(public[:12]) or 'nothing callable'}."
        raise PluginError(f"{key}: module {module_name!r} has no attribute {attr!r}.{hint}")
    return getattr(module, attr)


def resolve(path: str, key: str, kwargs: Mapping[str, Any] | None = None, n_positional: int = 1, *,
            hidden: Collection[str] = (), kwargs_key: str | None = None) -> Callable:
    """Import a callable and check that ``kwargs`` and ``n_positional`` inputs fit its signature
    (``hidden``, ``kwargs_key``: as for :func:`check_signature`)."""
    obj = import_object(path, key)
    if not callable(obj):
        raise PluginError(f"{key}: {path!r} is a {type(obj).__name__}, not a callable.")
    check_signature(obj, kwargs_key or key, kwargs or {}, n_positional, hidden=hidden)
    return obj


def check_signature(fn: Callable, key: str, kwargs: Mapping[str, Any], n_positional: int = 1, *,
                    hidden: Collection[str] = ()) -> None:
    """Raise ``PluginError`` unless ``fn(*n_positional args, **kwargs)`` can bind. ``hidden``: keyword arguments
    the trainer passes itself (a workflow's ``engine``, ...), left out of the message, which names the user's
    kwargs, a close name for an unknown one, and the parameters the user can set."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: nothing to check
    try:
        sig.bind(*([None] * n_positional), **dict(kwargs))
    except TypeError as e:
        accepted = [n for n, p in sig.parameters.items()
                    if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)][n_positional:]
        accepted = [n for n in accepted if n not in hidden]
        given = {k: v for k, v in kwargs.items() if k not in hidden}
        unknown = [k for k in given if k not in sig.parameters]
        hint = suggest(unknown[0], accepted) if unknown else ""
        name = getattr(fn, "__qualname__", repr(fn))
        raise PluginError(f"{key}: the kwargs {given} do not fit {name}{sig}: {e}.{hint} "
                          f"Accepted keyword arguments: {', '.join(accepted) or 'none'}.") from e
