"""The one index of the configuration's keys, read from the schema: every key with its dotted name, type,
default, description and whether it may be null. ``--help``, the override checks, validation, the
compatibility warnings and the keys test all read it, and :func:`suggest_key` is the one "did you mean".

A key's description is the attribute docstring of its dataclass field (the string literal on the line
after the field), read from the source with ``ast``, so nothing can drift from the schema. Defaults are
the schema's (the dataclass defaults); a section that is null by default lists the defaults an override
of one of its keys fills it with.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any

from ..errors import closest, suggest
from .schema import TrainerConfig


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of the schema: a value, or a section (a nested dataclass) holding ``children``.

    Attributes:
        dotted: the full name, e.g. ``actor.adv_norm.mean_level`` ("" is the root).
        annotation: the field's type as declared (``Optional[int]``, a dataclass, ...).
        default: the schema default (for a section: its default instance, or None).
        doc: the field's docstring (for a section, followed by its class docstring).
        nullable: whether null is a valid value.
        section: the dataclass of a section, None for a value.
        same_as: a top-level section with the keys and defaults of an earlier one (``ref`` of ``actor``).
    """

    dotted: str
    annotation: Any
    default: Any
    doc: str
    nullable: bool = False
    section: type | None = None
    children: tuple[Key, ...] = ()
    same_as: str = ""

    @property
    def name(self) -> str:
        return self.dotted.rsplit(".", 1)[-1]

    @property
    def kind(self) -> str:
        """The type as the help shows it (``int | null``, ``section``, ``dict``)."""
        return render_type(self.annotation)

    @property
    def value(self) -> str:
        """The default as it is written in YAML or on the command line."""
        if self.section is not None:
            return "null" if self.default is None else ""
        return render_value(self.default)

    @property
    def free_form(self) -> bool:
        """A ``dict`` value (kwargs): any key below it is the user's."""
        inner, _ = unwrap(self.annotation)
        return inner is Any or typing.get_origin(inner) in (dict, typing.Dict)  # noqa: UP006


def unwrap(tp: Any) -> tuple[Any, bool]:
    """``(inner type, nullable)`` of an annotation (``Optional[X]`` -> ``(X, True)``)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, tp is Any


def render_type(tp: Any) -> str:
    """``Optional[int]`` -> ``int | null``, ``Dict[str, Any]`` -> ``dict``, ``List[int]`` -> ``list[int]``."""
    names = {str: "str", int: "int", float: "float", bool: "bool", Any: "any", type(None): "null"}
    if tp in names:
        return names[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):  # null last, as in "int | null"
        return " | ".join([render_type(a) for a in args if a is not type(None)] + ["null"] * (type(None) in args))
    if origin in (dict, list):
        return origin.__name__ + (f"[{render_type(args[0])}]" if origin is list and args else "")
    return "section" if dataclasses.is_dataclass(tp) else getattr(tp, "__name__", str(tp))


def render_value(v: Any) -> str:
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if isinstance(v, str):
        return v or "''"
    return repr(v)


@functools.cache
def _source_docs(cls: type) -> tuple[str, dict[str, str]]:
    """The class docstring and the attribute docstrings of the fields that ``cls`` itself declares."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a zipped or frozen install): the keys are still listed
        return "", {}
    node = tree.body[0]
    docs = {}
    for stmt, nxt in zip(node.body, node.body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return ast.get_docstring(node) or "", docs


def field_doc(cls: type, name: str) -> str:
    """The field's docstring, from the nearest class of the MRO that documents it ("" if none does)."""
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}) and _source_docs(klass)[1].get(name):
            return _source_docs(klass)[1][name]
    return ""


def section_doc(cls: type) -> str:
    return _source_docs(cls)[0]


def defaults(cls: type) -> Any:
    """An instance of a config dataclass with its defaults."""
    return cls()


def _keys(cls: type, current: Any, prefix: str) -> tuple[Key, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp, v, dotted = hints[f.name], getattr(current, f.name), prefix + f.name
        inner, nullable = unwrap(tp)
        if not dataclasses.is_dataclass(inner):
            out.append(Key(dotted, tp, v, field_doc(cls, f.name), nullable))
            continue
        doc = "\n\n".join(d for d in dict.fromkeys((field_doc(cls, f.name), section_doc(inner))) if d)
        children = _keys(inner, defaults(inner) if v is None else v, dotted + ".")
        out.append(Key(dotted, tp, v, doc, nullable, inner, children))
    return tuple(out)


def _shape(key: Key) -> tuple:
    cut = len(key.dotted) + 1
    return tuple((k.dotted[cut:], k.kind, k.value) for k in walk(key) if k is not key)


@functools.cache
def schema() -> Key:
    """The whole tree: the root section "" whose children are the top-level keys."""
    top, seen = [], {}
    for k in _keys(TrainerConfig, defaults(TrainerConfig), ""):
        first = seen.setdefault(_shape(k), k.dotted) if k.section else k.dotted
        top.append(dataclasses.replace(k, same_as="" if first == k.dotted else first))
    return Key("", TrainerConfig, None, section_doc(TrainerConfig), False, TrainerConfig, tuple(top))


def walk(key: Key) -> Iterator[Key]:
    yield key
    for child in key.children:
        yield from walk(child)


@functools.cache
def index() -> dict[str, Key]:
    """Every key by its dotted name, in schema order ("" is the root)."""
    return {k.dotted: k for k in walk(schema())}


def lookup(dotted: str) -> Key | None:
    """The key ``dotted``, or for a name inside a free-form ``dict`` value (``rollout.vllm_kwargs.x``) that
    value's key; None when it does not exist."""
    keys = index()
    if dotted in keys:
        return keys[dotted]
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        outer = keys.get(".".join(parts[:i]))
        if outer is not None:
            return outer if outer.free_form else None
    return None


def value_at(cfg: Any, dotted: str) -> Any:
    """The value of ``dotted`` in a config object (None where a section on the way is null)."""
    node = cfg
    for part in dotted.split(".") if dotted else ():
        node = getattr(node, part, None)
    return node


def sections(cfg: Any) -> Iterator[tuple[str, Any]]:
    """``(dotted, node)`` for every section of ``cfg`` that is set (the root is "")."""
    for key in index().values():
        if key.section is not None:
            node = value_at(cfg, key.dotted)
            if node is not None:
                yield key.dotted, node


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _repaired(parts: list[str]) -> str | None:
    """``parts`` with each name that does not exist replaced by the closest one of its section."""
    keys, fixed = index(), []
    for part in parts:
        here = keys.get(_join(*fixed))
        if here is None or here.section is None:
            return None
        names = [c.name for c in here.children]
        close = closest(part, names)
        if close is None:
            return None
        fixed.append(close)
    return _join(*fixed)


def suggest_key(dotted: str) -> str:
    """`` Did you mean 'x'?`` for a key that does not exist ("" when nothing is close): the key with each
    misspelt name repaired within its section, else the same (or a close) name in another section."""
    keys, parts = index(), dotted.split(".")
    i = max(j for j in range(len(parts)) if _join(*parts[:j]) in keys)  # the longest prefix that exists
    if keys[_join(*parts[:i])].section is None:
        return f" {_join(*parts[:i])} is a value, not a section."
    fixed = _repaired(parts)
    if fixed:
        return f" Did you mean {fixed!r}?"
    last = {k.name for k in keys.values() if k.dotted}
    close = closest(parts[-1], last)
    same = [k for k in keys if k and close and k.rsplit(".", 1)[-1] == close]
    if same:
        return f" Did you mean {same[0]!r}?" + (f" (also: {', '.join(same[1:4])})" if same[1:] else "")
    return suggest(dotted, keys)
