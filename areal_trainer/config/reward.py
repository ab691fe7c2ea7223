"""How trajectories are scored: the ``reward`` section (functions, a reward model, a scoring service, and how
they run and combine) and every rule of its values. Binding the functions and checking the model's files
and the service's URL: ``components/reward.py``."""

from dataclasses import dataclass, field
from typing import Any

from ..dtypes import DTYPE_NAMES
from .base import Checked, at_least_one, fraction, integer_at_least, is_number, number_in, one_of, suggest

STYLES = ("auto", "sample", "batched")
"""``reward.style``: by the function's parameters, one call per sample, or TRL's batched form."""


def function_name(path: str) -> str:
    """A reward function's name in ``reward.kwargs`` (with a list of functions): the last part of its import path."""
    return path.rsplit(".", 1)[-1].split(":")[-1]


@dataclass
class RewardModelConfig(Checked):
    """A learned reward model scoring whole conversations (``reward/model.py``)."""

    path: str | None = None
    """A Hugging Face sequence classifier with one label (``AutoModelForSequenceClassification``), or a
    checkpoint directory of this trainer's critic (its value at the last token). null: no reward model."""
    dtype: str = "float32"
    """Precision of the reward model's weights."""
    micro_batch_size: int = 8
    """Conversations per forward of the reward model."""

    def check(self, key: str) -> list[str]:
        return one_of(f"{key}.dtype", self.dtype, DTYPE_NAMES) + at_least_one(f"{key}.micro_batch_size",
                                                                             self.micro_batch_size)


@dataclass
class RewardConfig(Checked):
    """Where rewards come from and how they are run (``reward/``): functions, a reward model, a scoring service.

    A function has one of two signatures (told apart by its parameters, or by ``style``): per sample,
    ``fn(prompt, completion, answer, **row_fields) -> float | None``; or TRL's batched form,
    ``fn(prompts, completions, **columns) -> list[float | None]`` (a function with a parameter named
    ``completions`` or ``prompts``). ``prompt`` is the row's own prompt (text, or chat messages for
    conversational rows), ``completion`` the answer (text, or ``[{"role": "assistant", "content": ...}]``
    for conversational rows), ``answer`` the row's answer column (None when there is none); every other
    column of the row is passed by name, as far as the function takes it. ``async def`` functions are
    awaited concurrently. ``None`` means "not applicable": left out of the weighted sum, and counted.
    Worked examples, the service protocol and the failure counters: docs/tasks.md."""

    fn: Any = "areal_trainer.reward.math.gsm8k_reward_fn"
    """Import path of the reward function, a list of them, or null (a reward model or a service alone)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the reward function on every call; with a list of functions, a map from
    a function's name (or path) to its kwargs."""
    style: str = "auto"
    """``auto`` (by the function's parameters), ``sample`` (one call per sample) or ``batched`` (TRL's form)."""
    weights: list[float] | None = None
    """One weight per reward source, in this order: the functions of ``fn``, then ``model``, then ``url``
    (null: 1 each). A sample's reward is the weighted sum of its sources' values."""
    workers: int = 1
    """Processes the reward functions run in, so that nothing they do (hang, crash, exit, run out of memory)
    can stop the trainer. 0: in the trainer's process, for debugging (a hanging function then hangs the run)."""
    timeout: float = 30.0
    """Seconds one call of a reward function may take; past it its worker is killed and replaced and the
    sample scores ``timeout_value`` (counted in ``reward/timeouts``)."""
    timeout_value: float = 0.0
    """Reward of a sample whose reward call ran out of time."""
    error_value: float = 0.0
    """Reward of a sample whose reward function raised, returned NaN or killed its worker (counted)."""
    max_error_fraction: float = 0.5
    """Stop the run when more than this fraction of one batch's samples failed for one source (timeouts
    aside), naming the function and one example."""
    url: str | None = None
    """A scoring service: batches are POSTed as ``{"samples": [{"prompt", "completion", "answer", "fields"}]}``
    and answered with ``{"rewards": [float | null, ...]}`` in order (``reward/remote.py``). null: none."""
    url_timeout: float = 30.0
    """Seconds one request to ``url`` may take."""
    url_retries: int = 3
    """Retries of a failed request to ``url`` (with backoff) before the run stops naming the URL and the response."""
    url_max_concurrent: int = 4
    """Most requests to ``url`` in flight at once."""
    url_batch_size: int = 64
    """Samples per request to ``url``."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A learned reward model (``reward.model.path``)."""

    def paths(self) -> list[str]:
        """The import paths of ``fn`` (none for null)."""
        return [] if self.fn is None else [self.fn] if isinstance(self.fn, str) else list(self.fn)

    def kwargs_of(self, path: str) -> dict[str, Any]:
        """The keyword arguments of the function at ``path``: ``kwargs`` itself with one function; with a list,
        the entry under the function's path or name (none when there is no entry)."""
        if len(self.paths()) <= 1:
            return dict(self.kwargs)
        own = self.kwargs.get(path, self.kwargs.get(function_name(path), {}))
        return dict(own) if isinstance(own, dict) else {}

    def _kwargs_problems(self, key: str) -> list[str]:
        """With a list of functions, ``kwargs`` maps each function (by path or name) to a map of its kwargs."""
        paths = self.paths()
        if len(paths) <= 1 or not isinstance(self.kwargs, dict):
            return []
        names = [*paths, *(function_name(p) for p in paths)]
        p = []
        for k, v in self.kwargs.items():
            if k not in names:
                p.append(f"{key}.kwargs.{k}: with a list of functions, the keys of {key}.kwargs name the functions "
                         f"(by name or path); {k!r} names none of them.{suggest(k, names)}")
            elif not isinstance(v, dict):
                p.append(f"{key}.kwargs.{k}: got {v!r}; give the function's keyword arguments as a map, "
                         f"e.g. {key}.kwargs.{k}={{tolerance: 0.1}}.")
        return p

    def check(self, key: str) -> list[str]:
        """Every rule of the section's values; the functions, the reward model's files and the service's URL
        are checked where they are bound (``components/reward.py``)."""
        p: list[str] = []
        fn_ok = self.fn is None or isinstance(self.fn, str) or (
            isinstance(self.fn, (list, tuple)) and all(isinstance(x, str) for x in self.fn))
        if not fn_ok:
            p.append(f"{key}.fn: got {self.fn!r}; give an import path 'package.module.function', a list of them, "
                     f"or null (with {key}.model.path or {key}.url).")
        p += one_of(f"{key}.style", self.style, STYLES)
        n_sources = (len(self.paths()) if fn_ok else 1) + bool(self.model.path) + bool(self.url)
        if n_sources == 0:
            p.append(f"{key}: no reward source: set {key}.fn (a function), {key}.model.path (a reward model) "
                     f"or {key}.url (a scoring service).")
        if self.weights is not None:
            if len(self.weights) != n_sources:
                p.append(f"{key}.weights: {len(self.weights)} weights for {n_sources} reward sources (the functions "
                         f"of {key}.fn in order, then {key}.model, then {key}.url); give one weight per source.")
            p += [f"{key}.weights[{i}]: got {w!r}; must be a number." for i, w in enumerate(self.weights)
                  if not is_number(w)]
        p += integer_at_least(f"{key}.workers", self.workers, 0,
                              note="0 runs the functions in the trainer's process, for debugging")
        for name in ("timeout", "url_timeout"):
            p += number_in(f"{key}.{name}", getattr(self, name), 0, open_low=True, unit="seconds")
        for name in ("timeout_value", "error_value"):
            if not is_number(getattr(self, name)):
                p.append(f"{key}.{name}: got {getattr(self, name)!r}; must be a number.")
        p += fraction(f"{key}.max_error_fraction", self.max_error_fraction)
        p += at_least_one(f"{key}.url_max_concurrent", self.url_max_concurrent)
        p += at_least_one(f"{key}.url_batch_size", self.url_batch_size)
        p += integer_at_least(f"{key}.url_retries", self.url_retries, 0)
        return p + (self._kwargs_problems(key) if fn_ok else [])
