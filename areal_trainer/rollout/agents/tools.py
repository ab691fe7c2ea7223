"""Tools for agents: their JSON schemas, and running them on the model's arguments.

Two parts, each usable alone (reading the calls out of sampled text is
:mod:`areal_trainer.rollout.agents.tool_parsers`):

* ``Tool`` is a function the model may call, described by an OpenAI function-calling schema.
  ``tool_from_function`` derives the schema from a Python function's type hints and Google-style
  docstring; ``tool_from_openai`` takes a hand-written (or agent-supplied) schema.
* ``run_tool`` / ``arun_tool`` call a tool with the model's JSON arguments. They never raise for
  anything the model or the tool did wrong: the error becomes the text the model sees next
  (``"Error: ZeroDivisionError: division by zero"``), as agent frameworks do, so a bad call costs
  the episode a turn instead of crashing the trainer; ``ok=False`` lets the caller count it.

Schema choices of ``tool_from_function`` (documented here because they are policy, not fact):
a parameter without annotation (or annotated ``Any``) gets an unconstrained schema ``{}``;
a parameter missing from the ``Args:`` section gets no ``description``; ``X | None`` is
``{"type": [X, "null"]}`` and other unions ``anyOf``; an annotation that has no JSON form (a class,
``Callable``, ``tuple[int, str]``, ...) raises ``ValueError``, since the model could not produce a
value of it; so do ``*args``, ``**kwargs`` and positional-only parameters, which keyword
arguments cannot fill. Default values are not put in the schema.
Arguments are not type-checked against the schema when a tool runs: the function gets the JSON
values as they are.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# OpenAI's rule for function names; models are trained on names of this shape.
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# ---------------------------------------------------------------------------------------- Tool


@dataclass(frozen=True)
class Tool:
    """A callable tool: ``parameters`` is a JSON schema of type object; ``fn`` is None for a
    schema-only tool (one the agent runs itself)."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] | None = None

    def to_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


def tool_from_openai(spec: dict[str, Any], *, fn: Callable[..., Any] | None = None) -> Tool:
    """A ``Tool`` from ``{"type": "function", "function": {...}}`` or the bare function dict."""
    if not isinstance(spec, dict):
        raise ValueError(f"tool spec: got {type(spec).__name__} {spec!r}; give a dict "
                         '{"type": "function", "function": {"name": ..., "parameters": {...}}}.')
    if "function" in spec:
        if spec.get("type", "function") != "function":
            raise ValueError(f"tool spec: type {spec['type']!r} is not supported; only 'function' tools are.")
        spec = spec["function"]
        if not isinstance(spec, dict):
            raise ValueError(f"tool spec: 'function' must be a dict, got {type(spec).__name__}.")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"tool spec: name {name!r} is invalid; give 1-64 letters, digits, '_' or '-'.")
    description = spec.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"tool {name!r}: description must be a string, got {type(description).__name__}.")
    parameters = spec.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ValueError(f"tool {name!r}: parameters must be a JSON schema of type 'object', got {parameters!r}.")
    if not isinstance(parameters.get("properties", {}), dict):
        raise ValueError(f"tool {name!r}: parameters.properties must be a dict of parameter schemas.")
    return Tool(name=name, description=description, parameters=parameters, fn=fn)


def tool_from_function(fn: Callable[..., Any]) -> Tool:
    """A ``Tool`` whose schema comes from ``fn``'s type hints and docstring (see module doc)."""
    name = getattr(fn, "__name__", "")
    if not _NAME_RE.match(name):
        raise ValueError(f"tool_from_function: {fn!r} has no usable name ({name!r}); use a named def "
                         "with 1-64 letters, digits, '_' or '-'.")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # noqa: BLE001 - a forward reference that does not resolve
        raise ValueError(f"tool {name!r}: cannot resolve its type hints ({e}).") from e
    description, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise ValueError(f"tool {name!r}: parameter {p} cannot be filled from JSON arguments; "
                             "use plain named parameters.")
        where = f"tool {name!r}, parameter {p.name!r}"
        schema = _schema_for(hints.get(p.name, Any), where)
        if p.name in arg_docs:
            schema["description"] = arg_docs[p.name]
        properties[p.name] = schema
        if p.default is p.empty:
            required.append(p.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool(name=name, description=description, parameters=parameters, fn=fn)


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_for(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one annotation; ``where`` names it in errors."""
    if hint is Any:
        return {}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if hint is type(None):
        return {"type": "null"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (list, tuple) or origin in (list, Sequence) or (origin is tuple and args[1:] == (Ellipsis,)):
        return {"type": "array", **({"items": _schema_for(args[0], where)} if args else {})}
    if hint is dict or origin is dict:
        if len(args) == 2 and args[1] is not Any:
            return {"type": "object", "additionalProperties": _schema_for(args[1], where)}
        return {"type": "object"}
    if origin is Literal:
        kinds = {_SIMPLE.get(type(v)) for v in args}
        if None in kinds:
            raise ValueError(f"{where}: Literal values must be str, int, float or bool, got {args!r}.")
        return {"type": kinds.pop(), "enum": list(args)} if len(kinds) == 1 else {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return _union_schema(args, where)
    raise ValueError(f"{where}: annotation {hint!r} has no JSON schema; use str, int, float, bool, "
                     "list[...], dict, Literal[...] or unions/Optional of these (or write the schema and "
                     "use tool_from_openai(spec, fn=...)).")


def _union_schema(args: tuple[Any, ...], where: str) -> dict[str, Any]:
    """``X | None`` as ``{"type": [X's type, "null"]}`` (the form OpenAI's strict mode uses), other
    unions as ``anyOf``."""
    rest = [a for a in args if a is not type(None)]
    inner = _schema_for(rest[0], where) if len(rest) == 1 else {"anyOf": [_schema_for(a, where) for a in rest]}
    if len(rest) == len(args) or not inner:  # no None in it, or already unconstrained
        return inner
    if isinstance(inner.get("type"), str):
        enum = {"enum": [*inner["enum"], None]} if "enum" in inner else {}
        return {**inner, "type": [inner["type"], "null"], **enum}
    return {"anyOf": [*inner.get("anyOf", [inner]), {"type": "null"}]}


# Google-style section headers; the first paragraph (the description) ends at one of them.
_SECTIONS = {"Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments", "Returns",
             "Return", "Yields", "Raises", "Examples", "Example", "Note", "Notes", "Attributes",
             "See Also", "Warning", "Warnings", "Todo"}
_ARG_SECTIONS = {"Args", "Arguments", "Parameters", "Params"}
_ARG_RE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _section(line: str) -> str | None:
    name = line.strip().removesuffix(":")
    return name if line.strip().endswith(":") and name in _SECTIONS else None


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph joined into one line, {arg: description} from a Google ``Args:`` section;
    an entry's continuation lines are indented deeper than its name)."""
    lines = doc.splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip() or _section(line):
            break
        first.append(line.strip())
    args: dict[str, str] = {}
    in_args, current, arg_indent = False, None, 0
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if (section := _section(line)) is not None:
            in_args, current = section in _ARG_SECTIONS, None
        elif in_args:
            m = _ARG_RE.match(line.strip())
            if m and (current is None or indent <= arg_indent):
                current, arg_indent = m.group(1), indent
                args[current] = m.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(first), args


# ---------------------------------------------------------------------------------- running


@dataclass(frozen=True)
class ToolResult:
    """What the model sees (``content``); ``ok`` is False when it is an error message."""

    content: str
    ok: bool
    ended: str | None = None
    """How a call past its time limit ended (``areal_trainer/failures.py::ENDINGS``): ``cancelled`` (a coroutine)
    or ``abandoned`` (a thread, left running); None for a call that did not run out of time."""


def _prepare(tool: Tool, arguments: str | dict[str, Any] | None) -> dict[str, Any] | ToolResult:
    """The call's keyword arguments, or the error result to give back instead of calling."""
    if tool.fn is None:
        return ToolResult(f"Error: tool {tool.name!r} has no implementation here.", ok=False)
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}  # models often write nothing for a tool without parameters
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return ToolResult(f"Error: arguments for {tool.name!r} are not valid JSON ({e}).", ok=False)
    if not isinstance(arguments, dict):
        return ToolResult(f"Error: arguments for {tool.name!r} must be a JSON object, "
                          f"got {type(arguments).__name__}.", ok=False)
    try:
        params = inspect.signature(tool.fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature: let the call decide
        return arguments
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [] if takes_any else sorted(set(arguments) - set(params))
    missing = [n for n, p in params.items() if p.default is p.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in arguments]
    if unknown or missing:
        expected = ", ".join(n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        problems = ([f"unknown argument(s) {', '.join(unknown)}"] if unknown else []) + (
            [f"missing required argument(s) {', '.join(missing)}"] if missing else [])
        return ToolResult(f"Error: bad arguments for {tool.name!r}: {'; '.join(problems)} "
                          f"(parameters: {expected or 'none'}).", ok=False)
    return arguments


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, dict | list | tuple):
        return json.dumps(result, ensure_ascii=False, default=str)
    return "" if result is None else str(result)


def _error(e: BaseException) -> ToolResult:
    return ToolResult(f"Error: {type(e).__name__}: {e}", ok=False)


def run_tool(tool: Tool, arguments: str | dict[str, Any] | None) -> ToolResult:
    """Call ``tool`` with the model's arguments in this thread. An async tool is run to completion
    in a fresh event loop, which is impossible inside a running loop: use ``arun_tool`` there."""
    kwargs = _prepare(tool, arguments)
    if isinstance(kwargs, ToolResult):
        return kwargs
    if inspect.iscoroutinefunction(tool.fn):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            return ToolResult(f"Error: tool {tool.name!r} is async; call it with arun_tool here.", ok=False)
    try:
        result = tool.fn(**kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return ToolResult(_as_text(result), ok=True)
    except Exception as e:  # noqa: BLE001 - the tool's error is the model's observation
        return _error(e)


async def _await(awaitable: Any) -> Any:
    return await awaitable


async def arun_tool(tool: Tool, arguments: str | dict[str, Any] | None, *,
                    timeout: float | None = None) -> ToolResult:
    """Call ``tool``: awaited if async, else in a worker thread so the event loop keeps running.
    After ``timeout`` seconds the result is a timeout error that says how the call ended (the tool kind of
    the failure policy, ``areal_trainer/failures.py``): an async tool is ``cancelled``, but a thread cannot be
    stopped, so a sync tool is ``abandoned``: it keeps running in the background until it returns."""
    kwargs = _prepare(tool, arguments)
    if isinstance(kwargs, ToolResult):
        return kwargs
    in_thread = [False]

    async def call() -> ToolResult:
        # Errors are turned into results in here, so that only wait_for's own timeout escapes (a
        # tool may raise TimeoutError itself, which is an ordinary tool error).
        try:
            if inspect.iscoroutinefunction(tool.fn):
                result = await tool.fn(**kwargs)
            else:
                in_thread[0] = True
                result = await asyncio.to_thread(tool.fn, **kwargs)
                in_thread[0] = False
            result = await result if inspect.isawaitable(result) else result
            return ToolResult(_as_text(result), ok=True)
        except Exception as e:  # noqa: BLE001 - the tool's error is the model's observation
            return _error(e)

    try:
        return await asyncio.wait_for(call(), timeout)
    except TimeoutError:
        return ToolResult(f"Error: tool {tool.name!r} timed out after {timeout:g} s.", ok=False,
                          ended="abandoned" if in_thread[0] else "cancelled")
