"""``--help``: every configuration key with its type, default and description, read from the schema.

A key's description is the attribute docstring of its dataclass field (the string literal on the line
after the field), read from the source with ``ast``, so the help cannot drift from the schema. The
defaults are the schema's (the dataclass defaults); the presets in ``conf/`` set some keys otherwise.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import fnmatch
import functools
import inspect
import json
import os
import re
import shutil
import sys
import textwrap
import types
import typing
from importlib import resources

from ..errors import suggest
from .base import deferred_validation
from .compat import IGNORED, REF_READ, REJECTED
from .overrides import CONFIG_GROUPS
from .schema import TrainerConfig

PROG = "python -m areal_trainer"
HEADER = (f"Configuration keys by section, with their schema defaults (a preset sets some keys otherwise: "
          f"`{PROG} --config-name grpo --cfg job` prints the composed values).")
FOOTER = "Defaults are the schema's; a preset may set other values (`--config-name PRESET --cfg job` prints them)."
# A period ends a sentence unless it ends "e.g.", "i.e." or "..."; the overview shows first sentences only.
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!\.\.)\.\s+(?=[A-Z0-9`(])")


class UnknownKeyError(LookupError):
    """``--help`` was asked about a key that does not exist; the message names the closest one."""


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of the schema: a value, or a section (a nested dataclass) holding ``children``."""

    dotted: str
    kind: str
    value: str
    doc: str
    children: tuple[Key, ...] = ()
    section: bool = False
    null: bool = False
    same_as: str = ""
    """A top-level section with the keys and defaults of an earlier one (``ref`` of ``actor``)."""


# -- reading the schema ------------------------------------------------------------------------------

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


def _section_class(tp) -> type | None:
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return args[0] if dataclasses.is_dataclass(args[0]) else None


def render_type(tp) -> str:
    """``Optional[int]`` -> ``int | null``, ``Dict[str, Any]`` -> ``dict``, ``List[int]`` -> ``list[int]``."""
    names = {str: "str", int: "int", float: "float", bool: "bool", typing.Any: "any", type(None): "null"}
    if tp in names:
        return names[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):  # null last, as in "int | null"
        return " | ".join([render_type(a) for a in args if a is not type(None)] + ["null"] * (type(None) in args))
    if origin in (dict, list):
        return origin.__name__ + (f"[{render_type(args[0])}]" if origin is list and args else "")
    return "section" if dataclasses.is_dataclass(tp) else getattr(tp, "__name__", str(tp))


def render_value(v) -> str:
    """A default as it is written in YAML or on the command line."""
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if isinstance(v, str):
        return v or "''"
    return repr(v)


def _defaults(cls: type):
    with deferred_validation():  # the defaults are valid; checking them would import torch for the maths
        return cls()


def _keys(cls: type, current, prefix: str) -> tuple[Key, ...]:
    """The keys of the dataclass ``cls``, with the values of its instance ``current`` as defaults."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp, v, dotted = hints[f.name], getattr(current, f.name), prefix + f.name
        sub = _section_class(tp)
        if sub is None:
            out.append(Key(dotted, render_type(tp), render_value(v), field_doc(cls, f.name)))
            continue
        doc = "\n\n".join(d for d in dict.fromkeys((field_doc(cls, f.name), _source_docs(sub)[0])) if d)
        # A section that is null by default lists what an override of one of its keys fills it with.
        children = _keys(sub, _defaults(sub) if v is None else v, dotted + ".")
        out.append(Key(dotted, render_type(tp), "null" if v is None else "", doc, children, True, v is None))
    return tuple(out)


def walk(key: Key):
    yield key
    for child in key.children:
        yield from walk(child)


def _shape(key: Key) -> str:
    """The keys below a section, relative to it, with their types and defaults."""
    cut = len(key.dotted) + 1
    return repr([(k.dotted[cut:], k.kind, k.value) for k in walk(key) if k is not key])


@functools.cache
def schema() -> Key:
    """The whole tree: a section named "" whose children are the top-level keys."""
    top, seen = [], {}
    for k in _keys(TrainerConfig, _defaults(TrainerConfig), ""):
        first = seen.setdefault(_shape(k), k.dotted) if k.section else k.dotted
        top.append(dataclasses.replace(k, same_as="" if first == k.dotted else first))
    return Key("", "section", "", "", tuple(top), True)


@functools.cache
def index() -> dict[str, Key]:
    """Every key by its dotted name, in schema order ("" is the root)."""
    return {k.dotted: k for k in walk(schema())}


# -- rendering -----------------------------------------------------------------------------------------

def _paragraphs(doc: str) -> list[str]:
    """Paragraphs with the source's line breaks undone, RST literals (double backticks) in single ones."""
    return [" ".join(p.split()).replace("``", "`") for p in doc.split("\n\n") if p.strip()]


def first_sentence(doc: str) -> str:
    paras = _paragraphs(doc)
    if not paras:
        return ""
    end = _SENTENCE_END.search(paras[0])
    return paras[0][: end.start() + 1] if end else paras[0]


def _wrap(text: str, indent: int, width: int) -> list[str]:
    pad = " " * indent  # import paths and names like seq-mean-token-sum-norm stay whole
    return textwrap.wrap(text, width, initial_indent=pad, subsequent_indent=pad, break_long_words=False,
                         break_on_hyphens=False)


def _doc_lines(doc: str, indent: int, width: int, full: bool, empty: str = "(no description)") -> list[str]:
    paras = _paragraphs(doc) if full else [first_sentence(doc)] if doc.strip() else []
    return [line for p in paras or ([empty] if empty else []) for line in _wrap(p, indent, width)]


def _notes(dotted: str) -> list[str]:
    """What ``config/compat.py`` says about a key that is rejected or ignored here."""
    def hit(pattern: str) -> bool:
        return fnmatch.fnmatch(dotted, pattern) or dotted.startswith(pattern + ".")

    notes = [f"Only some values work here: {why}." for p, why in REJECTED.items() if hit(p)]
    notes += [f"Has no effect here: {why}." for p, why in IGNORED.items() if hit(p)]
    if dotted.startswith("ref.") and dotted.split(".")[1] not in REF_READ:
        notes.append("Not read: the reference policy reads only ref.path and ref.dtype.")
    return notes


def _value_lines(key: Key, indent: int, width: int, full: bool) -> list[str]:
    lines = [f"{' ' * indent}{key.dotted}: {key.kind} = {key.value}", *_doc_lines(key.doc, indent + 4, width, full)]
    return lines + [line for n in (_notes(key.dotted) if full else []) for line in _wrap(n, indent + 4, width)]


def _section_lines(key: Key, width: int, full: bool) -> list[str]:
    lines = [(key.dotted or "Top-level keys") + (" (null by default)" if key.null else "")]
    lines += _doc_lines(key.doc, 2, width, full, empty="")
    if key.null and full:
        lines += _wrap(f"A command-line override of one of its keys (e.g. `{key.children[0].dotted}=...`) fills "
                       "it with the defaults below.", 2, width)
    if key.same_as and not full:
        return lines + _wrap(f"Same keys and defaults as `{key.same_as}`: `{PROG} --help {key.dotted}` lists "
                             "them.", 2, width)
    values = [c for c in key.children if not c.section]
    if full and values and len(lines) > 1:  # in the full text, the description stands apart from the keys
        lines.append("")
    lines += [line for c in values for line in _value_lines(c, 2, width, full)]
    return lines + [line for c in key.children if c.section for line in ["", *_section_lines(c, width, full)]]


def _choices(group: str = "") -> list[str]:
    """The YAML files (without ``.yaml``) of ``conf/``, the presets, or of one of its config groups."""
    try:
        root = resources.files("areal_trainer.conf")
        return sorted(p.name[:-5] for p in (root / group if group else root).iterdir() if p.name.endswith(".yaml"))
    except (ModuleNotFoundError, OSError):  # an install without conf/ still gets the key help
        return []


def usage(width: int = 100) -> str:
    presets = ", ".join(n for n in _choices() if n != "config")
    items = [
        ("--config-name PRESET", f"the default task with that algorithm: {presets} (default: config, GRPO)"),
        ("algo=NAME", "the same algorithm presets as a config group (conf/algo/), e.g. in sweeps"),
        ("KEY=VALUE", "set a key, e.g. actor.eps_clip=0.3 (+KEY=VALUE and ++KEY=VALUE work too)"),
        ("-m KEY=A,B ...", "a sweep, one job per combination: -m algo=grpo,rloo seed=1,2"),
        ("--cfg job [--resolve]", "print the composed configuration instead of training"),
        ("--help KEY", "one key, or a whole section, with its full description"),
        ("--hydra-help", "Hydra's own help"),
    ]
    lines = ["Usage", f"  {PROG} [--config-name PRESET] [algo=NAME] [KEY=VALUE ...]"]
    for flag, what in items:
        wrapped = _wrap(what, 28, width)
        lines += [f"    {flag:<23} {wrapped[0].lstrip()}", *wrapped[1:]]
    return "\n".join(lines)


def overview(width: int = 100) -> str:
    """The help of ``--help``: every key with the first sentence of its description, then the usage."""
    return "\n".join([*_wrap(HEADER, 0, width), "", *_section_lines(schema(), width, False), "", usage(width)])


# -- one key ---------------------------------------------------------------------------------------------

def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _repaired(parts: list[str]) -> str | None:
    """``parts`` with each name that does not exist replaced by the closest one of its section."""
    keys, fixed = index(), []
    for part in parts:
        names = [c.dotted.rsplit(".", 1)[-1] for c in keys[_join(*fixed)].children]
        close = [part] if part in names else difflib.get_close_matches(part, names, n=1, cutoff=0.6)
        if not close:
            return None
        fixed.append(close[0])
    return _join(*fixed)


def _closest(dotted: str) -> str:
    """A did-you-mean for a key that does not exist ("" when nothing is close)."""
    keys, parts = index(), dotted.split(".")
    i = max(j for j in range(len(parts)) if _join(*parts[:j]) in keys)  # the longest prefix that exists
    if not keys[_join(*parts[:i])].section:
        return f" {_join(*parts[:i])} is a value, not a section."
    fixed = _repaired(parts)
    if fixed:
        return f" Did you mean {fixed!r}?"
    # The name may be right (or close) but in another section: every key with that name, in schema order.
    last = {k.rsplit(".", 1)[-1] for k in keys if k}
    close = difflib.get_close_matches(parts[-1], last, n=1, cutoff=0.6)
    same = [k for k in keys if k and close and k.rsplit(".", 1)[-1] == close[0]]
    if same:
        return f" Did you mean {same[0]!r}?" + (f" (also: {', '.join(same[1:4])})" if same[1:] else "")
    return suggest(dotted, keys)


def _free_form(dotted: str) -> Key | None:
    """The ``dict`` key (e.g. ``rollout.vllm_kwargs``) that ``dotted`` lies inside, if any."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        key = index().get(_join(*parts[:i]))
        if key is not None:
            return key if key.kind.startswith("dict") else None
    return None


def key_help(dotted: str, width: int = 100) -> str:
    """The full help of one key, or of a section and everything in it; raises ``UnknownKeyError``."""
    dotted = dotted.lstrip("+")
    if dotted in CONFIG_GROUPS:
        return "\n".join(_wrap(f"{dotted}: a config group (conf/{dotted}/), chosen with {dotted}=NAME (+{dotted}=NAME "
                               f"when the config selects none); NAME is one of: {', '.join(_choices(dotted))}.", 0, width))
    if dotted.split(".")[0] == "hydra":
        return f"{dotted}: one of Hydra's own settings; see `{PROG} --hydra-help`."
    key = index().get(dotted) if dotted else None
    if key is None and (outer := _free_form(dotted)) is not None:
        return "\n".join([*_value_lines(outer, 0, width, True),
                          f"    {dotted} lies inside it: its keys are free-form, passed on as given."])
    if key is None:
        raise UnknownKeyError(f"{dotted!r} is not a configuration key.{_closest(dotted)} "
                              f"`{PROG} --help` lists every key.")
    lines = _section_lines(key, width, True) if key.section else _value_lines(key, 0, width, True)
    return "\n".join([*lines, "", *_wrap(FOOTER, 0, width)])


# -- the command line ------------------------------------------------------------------------------------

def help_request(argv: list[str]) -> tuple[bool, str | None]:
    """Whether ``argv`` asks for help (``--help``, ``-h``, ``--help KEY``, ``--help=KEY``), and about which key."""
    for i, arg in enumerate(argv):
        if arg.startswith("--help="):
            return True, arg.split("=", 1)[1] or None
        if arg in ("--help", "-h"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return True, nxt if nxt and not nxt.startswith("-") and "=" not in nxt else None
    return False, None


def _width() -> int:
    return max(60, min(100, shutil.get_terminal_size((100, 24)).columns))


def _emit(text: str, stream) -> None:
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:  # `--help | head`: the reader left; silence the error Python reports at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def handle_help(argv: list[str]) -> int | None:
    """Print the help that ``argv`` asks for and return the exit status; None when it asks for none."""
    asked, dotted = help_request(argv)
    if not asked:
        return None
    try:
        text = key_help(dotted, _width()) if dotted else overview(_width())
    except UnknownKeyError as e:
        _emit(f"Error: {e}", sys.stderr)
        return 2
    _emit(text, sys.stdout)
    return 0
