"""A user reward function given by import path: which of the two accepted forms it has, the calls
built for it from a batch of samples, and the checks on what it returns.

The two forms, told apart by signature once, at start-up (``style="auto"``):

1. **per sample**: ``fn(prompt, completion, answer, **row_fields) -> float | None``, called once per
   sample. It must take three positional parameters.
2. **batched** (TRL's form): ``fn(prompts, completions, **columns) -> list[float | None]``, called
   once per batch (or chunk of one) with keyword lists ``prompts``, ``completions``, ``answer`` (when
   the rows have answers, or the function names it) and one per row column. A function is batched when
   it has a parameter named ``completions`` or ``prompts``.

Row columns are passed only as far as the function takes them by name (all of them when it has
``**kwargs``), so a dataset may carry columns a function ignores. A parameter without a default that no
column of the dataset provides is reported at start-up, before any model loads
(:meth:`RewardFunction.column_problem`, called for every function by the reward's binding); one that only
some rows lack is reported when a batch of such rows is scored. The configured ``kwargs`` come last
and win over a column of the same name: they are what the user wrote down for this run.

A number (``bool`` counts as 0/1) or ``None`` ("not applicable", as in TRL) is a valid result. NaN
or infinity is a failure of that sample (counted as non-finite), not of the run. Anything else (a
string, a dict, a list of the wrong length from a batched function) means the function does not
keep its contract on any input, so it stops the run with :class:`~areal_trainer.errors.UserError`.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import plugins
from ..dtypes import fits_float32
from ..errors import UserError
from ..plugins import PluginError

STYLES = ("auto", "sample", "batched")
BATCH_NAMES = ("prompts", "completions", "answer")
"""Keyword lists every batched call offers; row columns of these names are not passed."""
FORMS = ("(1) per sample: fn(prompt, completion, answer, **row_fields) -> float | None, with three "
         "positional parameters; (2) batched, as in TRL: fn(prompts, completions, **columns) -> "
         "list[float | None], with a parameter named 'completions' or 'prompts'")

Checked = tuple[str, float | None]
"""A checked result: ``("ok", x)``, ``("none", None)``, ``("nonfinite", x)`` (NaN or infinite) or
``("out_of_range", x)`` (finite, but beyond float32: infinite in the trainer's tensors)."""


@dataclass(frozen=True)
class RewardSample:
    """One completion to score, with the dataset row it answers."""

    prompt: str | list[dict]
    """The row's own prompt: a string, or chat messages ``[{role, content}]``."""
    completion: str | list[dict]
    """The model's answer: text, or ``[{"role": "assistant", "content": text}]`` for chat rows."""
    answer: Any = None
    """The row's reference answer (None when the dataset has none)."""
    fields: Mapping[str, Any] = field(default_factory=dict)
    """Every other column of the row, by column name."""


def sample_of(row: Mapping[str, Any], completion: str) -> RewardSample:
    """The reward's view of one completion of a dataset row: the row's own prompt and columns."""
    chat = isinstance(row.get("prompt"), list)
    return RewardSample(prompt=row.get("prompt"), completion=[{"role": "assistant", "content": completion}] if chat
                        else completion, answer=row.get("answer"), fields=dict(row.get("fields") or {}))


def is_coroutine_function(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (``async def``, also behind ``partial`` or ``__call__``)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none
        return None


class RewardFunction:
    """A user function bound to its config key and kwargs; build with :meth:`bind`."""

    def __init__(self, fn: Callable, *, path: str, key: str, kwargs: Mapping[str, Any], style: str):
        self.fn, self.path, self.key, self.kwargs = fn, path, key, dict(kwargs)
        self.name: str = getattr(fn, "__name__", None) or type(fn).__name__
        self.is_async: bool = is_coroutine_function(fn)
        self._sig = _signature(fn)
        params = list(self._sig.parameters.values()) if self._sig else []
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._varkw = any(p.kind == p.VAR_KEYWORD for p in params)
        self._varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        if style == "auto":
            style = "batched" if any(p.name in ("completions", "prompts") for p in params) else "sample"
        self.style: str = style
        # Names the three positional arguments fill (per sample) or the batch lists use (batched):
        # a row column of such a name would collide with them, so it is never passed.
        self._reserved = {p.name for p in positional[:3]} if style == "sample" else set(BATCH_NAMES)
        filled = positional[:3] if style == "sample" else []
        keyword = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p not in filled]
        self._named = {p.name for p in keyword}
        self._required = {p.name for p in keyword if p.default is p.empty} - set(self.kwargs) - self._reserved
        self._n_positional = len(positional)
        self._checked_columns: set[frozenset] = set()

    @classmethod
    def bind(cls, path: str, *, kwargs: Mapping[str, Any], key: str, style: str = "auto") -> RewardFunction:
        """Import ``path`` and check that it has one of the two forms and takes ``kwargs``;
        raises :class:`PluginError` (message starting with ``key``) otherwise."""
        if style not in STYLES:
            raise PluginError(f"{key}: style {style!r} is not one of {', '.join(map(repr, STYLES))}.")
        fn = plugins.import_object(path, key)
        if not callable(fn):
            raise PluginError(f"{key}: {path!r} is a {type(fn).__name__}, not a callable.")
        bound = cls(fn, path=path, key=key, kwargs=kwargs, style=style)
        bound._check_form()
        bound._check_kwargs()
        return bound

    def _shown(self) -> str:
        return f"{self.path}{self._sig}" if self._sig else self.path

    def _check_form(self) -> None:
        if self._sig is None:
            return  # nothing to check on a callable without a signature
        params = self._sig.parameters.values()
        if self.style == "sample" and not (self._n_positional >= 3 or self._varargs):
            raise PluginError(f"{self.key}: {self._shown()} fits neither accepted form of a reward function: "
                              f"{FORMS}. Change its signature to one of them.")
        if self.style == "sample":
            extra = [p for p in list(params)[3:] if p.kind == p.POSITIONAL_ONLY and p.default is p.empty]
        else:
            extra = [p for p in params if p.kind == p.POSITIONAL_ONLY and p.default is p.empty]
        if extra:
            raise PluginError(f"{self.key}: {self._shown()} has the positional-only parameter {extra[0].name!r}, "
                              f"which a {self.style} call cannot fill (arguments after the first "
                              f"{3 if self.style == 'sample' else 0} are passed by name). Remove the '/'. "
                              f"Accepted forms: {FORMS}.")

    def _check_kwargs(self) -> None:
        clash = sorted(set(self.kwargs) & (self._reserved | (set(BATCH_NAMES) if self.style == "batched" else set())))
        if clash:
            raise PluginError(f"{self.key}: kwargs {clash} collide with the arguments every {self.style} call "
                              f"of {self.path} already gets; rename them.")
        if self._sig is None:
            return
        try:
            if self.style == "sample":
                self._sig.bind_partial(None, None, None, **self.kwargs)
            else:
                self._sig.bind_partial(**self.kwargs)
        except TypeError as e:
            raise PluginError(f"{self.key}: the kwargs {self.kwargs} do not fit {self._shown()}: {e}. "
                              f"{self._accepted()}") from e

    def _accepted(self) -> str:
        if self._varkw:
            return "It takes **kwargs, so any keyword that names no other parameter is accepted."
        names = sorted(self._named - self._reserved)
        if not names:
            return "It takes no keyword arguments: remove the kwargs or add them to its signature."
        return f"It accepts the keyword arguments {', '.join(names)}."

    def takes(self, name: str) -> bool:
        """Whether a column (or batch list) called ``name`` is passed to the function."""
        return name not in self._reserved and (self._varkw or name in self._named)

    def startup_problems(self) -> list[str]:
        """What the function's own ``startup_check(kwargs, *, key)`` (an attribute, if it has one) finds wrong
        with running it here: a code reward whose box cannot isolate, say. Called once at start-up."""
        check = getattr(self.fn, "startup_check", None)
        return list(check(dict(self.kwargs), key=self.key)) if callable(check) else []

    def column_problem(self, columns: frozenset, rows: str = "the dataset rows") -> str | None:
        """The problem of a function whose required parameters ``columns`` (the rows' column names) do not
        all provide, or None; ``rows`` says which rows, e.g. "the rows of train_dataset"."""
        missing = sorted(self._required - columns)
        if not missing:
            return None
        return (f"{self.key}: {self._shown()} needs {', '.join(map(repr, missing))}, which neither {rows} (columns: "
                f"{', '.join(sorted(columns - set(BATCH_NAMES))) or 'none'}) nor the configured kwargs provide. Add "
                "the column, give the parameter a default, or set it in the kwargs.")

    def _check_columns(self, columns: frozenset) -> None:
        """At call time: a column that some rows lack (start-up checked that some row has each one)."""
        if columns in self._checked_columns:
            return
        problem = self.column_problem(columns)
        if problem:
            raise UserError(problem)
        self._checked_columns.add(columns)

    def sample_call(self, sample: RewardSample) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of the per-sample call for ``sample``."""
        self._check_columns(frozenset(sample.fields))
        kwargs = {k: v for k, v in sample.fields.items() if self.takes(k)}
        kwargs.update(self.kwargs)
        return (sample.prompt, sample.completion, sample.answer), kwargs

    def batch_call(self, samples: Sequence[RewardSample]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of the batched call for ``samples``; a column missing from some rows is None there."""
        columns: dict[str, None] = {}
        for s in samples:
            columns.update(dict.fromkeys(s.fields))
        self._check_columns(frozenset(columns) | set(BATCH_NAMES))
        kwargs = {}
        has_answer = any(s.answer is not None for s in samples)  # a dataset without answers: no such column
        for name, get in (("prompts", lambda s: s.prompt), ("completions", lambda s: s.completion),
                          ("answer", lambda s: s.answer)):
            if name in self._named or (self._varkw and (name != "answer" or has_answer)):
                kwargs[name] = [get(s) for s in samples]
        for col in columns:
            if self.takes(col):
                kwargs[col] = [s.fields.get(col) for s in samples]
        kwargs.update(self.kwargs)
        return (), kwargs

    def check(self, value: Any, index: int | None = None) -> Checked:
        """Classify one returned value; raises :class:`UserError` for a value that is no number nor None."""
        if value is None:
            return "none", None
        if isinstance(value, numbers.Real):
            return classify(value)
        where = "" if index is None else f" at position {index} of its list"
        raise UserError(f"{self.key}: reward function {self.path} returned {_excerpt(value)} "
                        f"({type(value).__name__}){where}; a reward must be a number (float) or None "
                        "(not applicable). Fix the function to return float(...) or None.")

    def check_batch(self, values: Any, n: int) -> list[Checked]:
        """Check a batched call's result for ``n`` samples (a list of one number or None per sample)."""
        if not isinstance(values, (list, tuple)):
            raise UserError(f"{self.key}: batched reward function {self.path} returned {_excerpt(values)} "
                            f"({type(values).__name__}); it must return a list with one reward (a number or "
                            "None) per completion, in order.")
        if len(values) != n:
            raise UserError(f"{self.key}: batched reward function {self.path} returned {len(values)} values for "
                            f"{n} completions ({_excerpt(values)}); it must return exactly one reward (a number "
                            "or None) per completion, in order.")
        return [self.check(v, i) for i, v in enumerate(values)]


def classify(value: numbers.Real) -> Checked:
    """A number's status as a reward: ``ok`` (with it as a float), ``nonfinite`` (NaN or infinite) or
    ``out_of_range`` (beyond float32, also an int too large for a float, which is kept as it is)."""
    try:
        x = float(value)
    except OverflowError:
        return "out_of_range", value
    if fits_float32(x):
        return "ok", x
    return ("out_of_range" if math.isfinite(x) else "nonfinite"), x


def _excerpt(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
