"""Binding ``reward.*`` once: the reward functions (either signature), a reward model, a scoring service,
how they combine, and the run's one failure policy of user code (``areal_trainer/failures.py``: reward
functions, the code box, agents' tools and agent episodes), which the reward service, the agent workflow and
its tools all receive. Nothing starts here (no worker process, no model): :meth:`RewardSpec.start` does
that when the run begins, and the run closes what it started.

The sources, in the order ``reward.weights`` follows: the environment's own scoring (``environment`` in
``reward.fn``, first; a single-turn environment, ``components/environment.py``), the functions of ``reward.fn``
(in list order), then the reward model (``reward.model.path``), then the remote service (``reward.url``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..environments.reward import NAME, EnvironmentReward
from ..errors import is_number
from ..failures import CODE_TIMEOUT, FailurePolicy
from ..plugins import PluginError
from ..reward.code import unit_tests
from ..reward.functions import RewardFunction
from ..reward.remote import url_problems


@dataclass(frozen=True)
class RewardSpec:
    """The bound reward sources and their combination (see the module docstring)."""

    functions: tuple[RewardFunction, ...]
    weights: tuple[float, ...] | None
    workers: int
    failures: FailurePolicy
    """The run's failure policy (``reward.timeout``, ``reward.error_value``, ``reward.timeout_value``,
    ``reward.max_error_fraction``, the code box's limit, ``rollout.agent_timeout``)."""
    model: dict[str, Any] | None = None
    """``ModelReward``'s arguments (``path``, ``dtype``, ``micro_batch_size``), or None without a reward model."""
    remote: dict[str, Any] | None = None
    """``RemoteReward``'s arguments (``url``, ``timeout``, ``retries``, ...), or None without a scoring service."""
    environment: Any = None
    """The adapter of a single-turn environment whose own scoring is the first source (``reward.fn`` names
    ``environment``), or None."""
    environment_label: str = ""

    def column_problems(self, columns: Mapping[str, Collection[str]]) -> list[str]:
        """Every function's required parameters that no column of a dataset provides: ``columns`` maps each
        dataset's key (``train_dataset``) to the column names its rows have; one problem per function and
        dataset, so that every one is reported at start-up, before any model loads."""
        return [problem for dataset, names in columns.items() for fn in self.functions
                if (problem := fn.column_problem(frozenset(names), f"the rows of {dataset}"))]

    @property
    def names(self) -> list[str]:
        return ([NAME] if self.environment is not None else []) + [f.name for f in self.functions] + (
            ["reward_model"] if self.model else []) + (["remote"] if self.remote else [])

    def start(self, *, device):
        """The running reward service: worker pools, the reward model on ``device``, the service's client."""
        from ..reward.model import ModelReward, ModelSource
        from ..reward.remote import RemoteReward
        from ..reward.service import FunctionReward, RewardService

        sources: list = ([EnvironmentReward(self.environment, timeout=self.failures.reward.timeout)]
                         if self.environment else [])
        sources += [FunctionReward(fn, workers=self.workers, timeout=self.failures.reward.timeout)
                    for fn in self.functions]
        if self.model:
            sources.append(ModelSource(ModelReward(device=device, **self.model)))
        if self.remote:
            sources.append(RemoteReward(**self.remote))
        return RewardService(sources, weights=list(self.weights) if self.weights else None, failures=self.failures)


def bind_failures(r, functions: list[RewardFunction], agent_timeout: float | None = None) -> FailurePolicy:
    """The failure policy of the ``reward`` section ``r``, its bound ``functions`` (the code box's limit is
    ``unit_tests``' ``timeout``: the longest where several are bound) and ``rollout.agent_timeout``."""
    boxes = [fn.kwargs.get("timeout", CODE_TIMEOUT) for fn in functions if fn.fn is unit_tests]
    boxes = [float(t) for t in boxes if is_number(t)]  # a bad one is the function's own start-up problem
    return FailurePolicy.of(error_value=float(r.error_value), timeout_value=float(r.timeout_value),
                            max_error_fraction=float(r.max_error_fraction), reward_timeout=float(r.timeout),
                            reward_workers=r.workers, code_timeout=max(boxes, default=None),
                            agent_timeout=agent_timeout)


def bind_reward(r, problems: list[str], *, light: bool = False, agent_timeout: float | None = None,
                environment=None) -> RewardSpec | None:
    """The reward ``r`` (the ``reward`` section) describes; every problem is appended to ``problems``. A section
    whose values break its rules (``config/reward.py``, reported by the config's own check) is not bound.
    ``light``: without the check of ``reward.model.path``'s files, whose module (``reward/model.py``) imports
    torch and transformers. ``agent_timeout``: ``rollout.agent_timeout``, for the failure policy.
    ``environment``: the bound environment (``EnvironmentSpec``), whose scoring the name ``environment`` in
    ``reward.fn`` stands for (checked by ``components/environment.py``)."""
    if r.check("reward"):
        return None
    n = len(problems)
    paths = r.paths()
    functions = []
    for i, path in enumerate(paths):
        if path == NAME:
            continue
        key = "reward.fn" if isinstance(r.fn, str) else f"reward.fn[{i}]"
        try:
            functions.append(RewardFunction.bind(path, kwargs=r.kwargs_of(path), key=key, style=r.style))
        except PluginError as e:
            problems.append(str(e))
    if not light:  # runs a process or two (a code reward's probe of its box): not on the command line's fast path
        problems += [p for fn in functions for p in fn.startup_problems()]
    failures = bind_failures(r, functions, agent_timeout)
    problems += failures.problems()
    if r.url is not None:
        problems += url_problems(r.url, "reward.url")
    if r.model.path and not light:
        from ..reward.model import reward_model_problems

        problems += reward_model_problems(r.model.path, "reward.model.path")
    if len(problems) > n:
        return None
    model = dict(path=r.model.path, dtype=r.model.dtype, micro_batch_size=r.model.micro_batch_size) \
        if r.model.path else None
    remote = dict(url=r.url, timeout=r.url_timeout, retries=r.url_retries, max_concurrent=r.url_max_concurrent,
                  batch_size=r.url_batch_size) if r.url else None
    # A multi-turn environment's episodes are scored by its agent (``environments/agent.py``), never by this
    # source; it is bound all the same, so that the service the run starts has its one source.
    env = environment if NAME in paths and environment is not None else None
    return RewardSpec(tuple(functions), None if r.weights is None else tuple(float(w) for w in r.weights),
                      workers=r.workers, failures=failures, model=model, remote=remote,
                      environment=None if env is None else env.adapter,
                      environment_label="" if environment is None else environment.label)
