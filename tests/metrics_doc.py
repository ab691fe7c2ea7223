"""Which metric keys docs/metrics.md documents: every backticked key of its text, with ``{a,b}`` read as
alternatives and ``<name>`` as any one path segment (``reward/<source>``, ``staleness/frac_<k>``); the
held-out evaluation's ``eval/<key>`` for the training keys it repeats (``eval/reward/...``, ``eval/agent/...``,
``eval/env/...``).
``undocumented(keys)`` is what a test asserts to be empty for every key a run logs."""

from __future__ import annotations

import functools
import itertools
import os
import re

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "metrics.md")
REPEATED_AT_EVAL = ("reward/", "agent/", "distill/", "env/")
"""Namespaces whose keys the held-out evaluation logs again under ``eval/`` (docs/metrics.md says so)."""
BOOKKEEPING = {"step"}
"""Keys of a record that are not metrics."""


def _expand(token: str) -> list[str]:
    parts = re.split(r"(\{[^{}]*\})", token)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c).strip() for c in itertools.product(*choices)]


@functools.cache
def patterns() -> tuple[re.Pattern, ...]:
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    out = []
    for token in re.findall(r"`([^`\s]+)`", text):
        for key in _expand(token):
            if "/" not in key and key not in ("lr",):
                continue
            regex = "".join("[^/]+" if part.startswith("<") else re.escape(part)
                            for part in re.split(r"(<[^<>]+>)", key))
            out.append(re.compile(regex + r"\Z"))
    return tuple(out)


def documented(key: str) -> bool:
    if key in BOOKKEEPING or any(p.match(key) for p in patterns()):
        return True
    inner = key.removeprefix("eval/")
    return inner != key and inner.startswith(REPEATED_AT_EVAL) and documented(inner)


def undocumented(keys) -> list[str]:
    return sorted({k for k in keys if not documented(k)})
