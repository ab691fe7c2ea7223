"""Command-line overrides: make ``+key=v`` and ``key={...}`` (a mapping for a key whose type is a dict)
work for schema keys, and check every override against the schema before Hydra sees it, so that all
unknown keys and wrong types are reported together with a did-you-mean suggestion (Hydra itself stops
at the first one).
"""

from __future__ import annotations

import functools
import os
import re
import typing
from collections.abc import Sequence
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, OverrideType
from hydra.errors import OverrideParseException

from .keys import index, lookup, suggest_key, unwrap

#: Hydra config groups of ``conf/`` (``algo=ppo`` selects a file, it is not a value key).
CONFIG_GROUPS = ("algo", "algo_tuning", "scale", "correction")


def config_dirs(argv: Sequence[str]) -> list[str]:
    """The user's config folders a command line adds (``--config-dir x``, ``-cd x``, ``--config-dir=x``)."""
    out = []
    for i, a in enumerate(argv):
        opt, eq, value = a.partition("=")
        if opt in ("--config-dir", "-cd"):
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value:
                out.append(value)
    return out


def config_groups(dirs: Sequence[str] = ()) -> frozenset[str]:
    """The config groups an override may select: ``conf/``'s and every subfolder of ``dirs`` holding a YAML
    file (Hydra's own pattern for experiments: ``--config-dir my_conf +experiment=a``)."""
    found = set(CONFIG_GROUPS)
    for d in dirs:
        if os.path.isdir(d):
            found.update(e.name for e in os.scandir(d) if e.is_dir() and any(
                f.endswith((".yaml", ".yml")) for f in os.listdir(e.path)))
    return frozenset(found)
_BOOL_WORDS = {"yes", "no", "on", "off", "y", "n", "true", "false"}


def normalize_overrides(args: list[str], groups: frozenset[str] = frozenset(CONFIG_GROUPS)) -> list[str]:
    """Rewrite ``+key=v`` to ``++key=v`` for value keys, so it works whether or not the YAML sets the key;
    and ``key=v`` to ``++key=v`` for a key whose type is a dict (``rollout.agent_kwargs={max_turns: 2}``),
    which Hydra would otherwise refuse for every name the YAML's mapping lacks. Either way the value is
    merged into the YAML's mapping, as Hydra merges a mapping into one it may extend.

    Group appends (``+experiment=x``, ``+algo@pkg=x``; ``groups``: the config groups, ``conf/``'s and those
    of a ``--config-dir``) and everything else are left alone.
    """
    out = []
    for a in args:
        if a.startswith("+") and not a.startswith("++") and "=" in a:
            key = a[1:].split("=", 1)[0]
            if "@" not in key and "/" not in key and key not in groups and not key.startswith("hydra"):
                a = "+" + a
        elif not a.startswith(("+", "~", "-")) and a.split("=", 1)[0] in dict_keys():
            a = "++" + a
        out.append(a)
    return out


@functools.cache
def dict_keys() -> frozenset[str]:
    """Every key whose schema type is a dict (``rollout.agent_kwargs``, ``reward.kwargs``, ``teacher.teachers``...)."""
    return frozenset(k.dotted for k in index().values() if k.section is None and _is_dict(k.annotation))


def _is_dict(tp: Any) -> bool:
    return typing.get_origin(unwrap(tp)[0]) in (dict, typing.Dict)  # noqa: UP006


def mapping_problem(key: str, got: str) -> str:
    """The message for a value of a dict-valued key that is no mapping; ``got`` says what was written."""
    return (f"{key}: got {got}; expected a mapping, written {key}='{{name: value, ...}}' (quoted for the shell, "
            f"or quote the whole override: '{key}={{name: value, ...}}').")


def _type_problem(key: str, tp: Any, value: Any) -> str | None:
    inner, optional = unwrap(tp)
    if value is None:
        return None if (optional or inner is Any) else f"{key}: null is not allowed here (expected {_tname(inner)})."
    if isinstance(value, str) and value.startswith("${"):
        return None  # an interpolation; OmegaConf checks it after resolution
    ok = True
    if inner is bool:
        ok = isinstance(value, bool) or (isinstance(value, str) and value.lower() in _BOOL_WORDS)
    elif inner is int:
        ok = ((isinstance(value, int) and not isinstance(value, bool))
              or (isinstance(value, float) and value.is_integer()))
    elif inner is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif inner is str:
        ok = not isinstance(value, (list, dict))
    elif typing.get_origin(inner) in (list, typing.List):  # noqa: UP006
        ok = isinstance(value, list)
    elif typing.get_origin(inner) in (dict, typing.Dict):  # noqa: UP006
        if not isinstance(value, dict):
            return mapping_problem(key, repr(value))
    if ok:
        return None
    return f"{key}: got {value!r}, which is not a valid {_tname(inner)}."


def _tname(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def split_overrides(args: list[str], groups: frozenset[str] = frozenset(CONFIG_GROUPS)) -> tuple[list[str], list[str]]:
    """(every problem of ``args``, the overrides of ``args`` that have none, in order); an override Hydra
    cannot parse is a problem too. ``groups``: the config groups an override may select."""
    parser = OverridesParser.create()
    problems: list[str] = []
    usable: list[str] = []
    for arg in args:
        try:
            (ov,) = parser.parse_overrides([arg])
        except OverrideParseException as e:
            problems.append(_unparsable(arg, str(e).splitlines()[0]))
            continue
        mine = _override_problems(ov, groups)
        problems += mine
        if not mine:
            usable.append(arg)
    return problems, usable


def _unparsable(arg: str, why: str) -> str:
    key, _, value = arg.partition("=")
    key = key.lstrip("+~")
    if key in dict_keys():  # e.g. '{a: 1' or, unquoted in the shell, '{a:' (the shell split it at the space)
        return mapping_problem(key, f"{value}, which Hydra cannot parse ({why})")
    return f"{arg}: Hydra cannot parse this override ({why})."


def _quoted(ov) -> bool:
    """Whether the value of ``ov`` was written in quotes (Hydra then reads it as text, whatever it holds)."""
    return (ov.input_line or "").partition("=")[2].lstrip()[:1] in ("'", '"')


def _override_problems(ov, groups: frozenset[str]) -> list[str]:
    key = ov.key_or_group
    if key in groups or "/" in key or key.startswith("hydra") or ov.package is not None:
        return []
    if ov.type == OverrideType.DEL:
        return []
    found = lookup(key)
    if found is None:
        return [f"{key}: not a configuration key.{suggest_key(key)}"]
    if found.section is not None or found.dotted != key:  # a section, or inside a free-form dict
        return []
    raw = ov.value()
    if key in dict_keys() and isinstance(raw, str) and _quoted(ov):
        return [mapping_problem(key, f"the quoted text {raw!r}, which Hydra reads as a string")]
    values = raw.list if isinstance(raw, ChoiceSweep) else ([] if ov.is_sweep_override() else [raw])
    return [msg for v in values if (msg := _type_problem(key, found.annotation, v))]


def config_name_of(argv: list[str], default: str = "config") -> str | None:
    """The primary config a command line names (``--config-name x``, ``-cn x``, ``--config-name=x``), or
    None where it cannot be composed from the package's configs alone (``--config-path``, ``--config-dir``,
    a ``-m`` sweep)."""
    name = default
    for i, a in enumerate(argv):
        opt, eq, value = a.partition("=")
        if opt in ("--config-path", "-cp", "--config-dir", "-cd", "-m", "--multirun"):
            return None
        if opt in ("--config-name", "-cn"):
            name = value if eq else (argv[i + 1] if i + 1 < len(argv) else default)
    return name


def group_file_problems(args: Sequence[str], dirs: Sequence[str]) -> list[str]:
    """Unknown keys and wrong types in the YAML files that the ``group=option`` overrides of ``args`` select
    from the ``--config-dir`` folders ``dirs`` (every option of a sweep), each naming its file, so that
    they are reported with the command line's own problems rather than by Hydra one at a time."""
    groups = config_groups(dirs) - set(CONFIG_GROUPS)
    parser = OverridesParser.create()
    problems: list[str] = []
    for arg in args:
        try:
            (ov,) = parser.parse_overrides([arg.lstrip("+")])
        except OverrideParseException:
            continue  # reported by split_overrides
        if ov.key_or_group not in groups or ov.package is not None:
            continue
        raw = ov.value()
        for option in (raw.list if isinstance(raw, ChoiceSweep) else [raw]):
            path = next((f for d in dirs if os.path.isfile(f := os.path.join(d, ov.key_or_group, f"{option}.yaml"))),
                        None)
            if path is not None:  # a missing option is Hydra's to report, with the options there are
                problems += _file_problems(path, ov.key_or_group)
    return problems


def _file_problems(path: str, group: str) -> list[str]:
    with open(path) as f:
        text = f.read()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        return [f"{path}: not valid YAML ({str(e).splitlines()[0]})."]
    if not isinstance(data, dict):
        return [f"{path}: must hold keys and values, not a {type(data).__name__}."]
    header = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
    package = header.group(1) if header else group  # Hydra's default package of a group's file: the group
    prefix = "" if package == "_global_" else package.replace("_group_", group) + "."
    out: list[str] = []

    def walk(node: dict, dotted: str) -> None:
        for k, v in node.items():
            key = f"{dotted}{k}"
            if not dotted and k in ("defaults", "hydra"):
                continue
            found = lookup(key)
            if found is None:
                out.append(f"{path}: {key}: not a configuration key.{suggest_key(key)}")
            elif found.section is not None and found.dotted == key and isinstance(v, dict):
                walk(v, key + ".")
            elif found.section is None and found.dotted == key and (msg := _type_problem(key, found.annotation, v)):
                out.append(f"{path}: {msg}")

    walk(data, prefix)
    return out
