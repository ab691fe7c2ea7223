"""Binding ``rollout.*`` once: the engine from the registry (with the rules its capabilities imply), the
workflow class (or the agent, run by the agent workflow; or a multi-turn environment's episodes, run by the
environment's agent workflow, ``environments/workflow.py``), and the dynamic filter.

``rollout.turn_discount`` is the one discount key: the agent workflow's per-call discount (null: 1), and
handed to a workflow class that takes ``turn_discount`` (``MultiTurnWorkflow``; null: the class's own
default). ``rollout.workflow_kwargs.turn_discount``, its old place, still works for such a class, with a
warning naming the key; both set to different values is an error."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config.servers import using_servers
from ..errors import one_of
from ..failures import FailurePolicy
from ..plugins import PluginError, check_signature, resolve
from ..rollout.agents import processes as agent_processes
from ..rollout.agents.spec import load_agent
from ..rollout.agents.tool_parsers import get_parser
from ..rollout.engines.backends import ENGINES, EngineSpec
from .servers import bind_servers


@dataclass(frozen=True)
class RolloutParts:
    """What ``rollout.*`` names, resolved: the engine's registry entry, the workflow class with its kwargs,
    and the dynamic filter (or None)."""

    engine: EngineSpec
    engine_kwargs: dict[str, Any]
    workflow: type
    workflow_kwargs: dict[str, Any] = field(default_factory=dict)
    accept: Callable | None = None
    turn_discount: float = 1.0
    """The per-call discount of the agent's rewards (``rollout.turn_discount``, null: 1), which held-out
    evaluation undoes to judge an agent episode's own reward."""


def bind_rollout(cfg, problems: list[str], *, light: bool = False, warns: list[str] | None = None,
                 failures: FailurePolicy | None = None, environment=None) -> RolloutParts | None:
    """The rollout's parts; every problem is appended to ``problems`` (None when there were any, and with
    ``light``), every warning to ``warns``. ``light``: without resolving the workflow or filter when it is one
    of this package's own, whose modules import torch (a user's path is resolved: its imports are the user's).
    ``failures``: the run's failure policy (``components/reward.py::bind_failures``), which the agent workflow
    and its tools follow (None: the defaults, with ``rollout.agent_timeout``). ``environment``: the bound
    environment (``components/environment.py``), whose episodes a multi-turn one runs as agents."""
    r = cfg.rollout
    n = len(problems)
    engine = _engine(cfg, problems, light)
    failures = failures if failures is not None else FailurePolicy.of(agent_timeout=r.agent_timeout)
    if environment is not None and environment.multi_turn:
        workflow, workflow_kwargs = _environment(cfg, environment, problems, light, failures)
    elif r.agent is not None:
        workflow, workflow_kwargs = _agent(cfg, problems, light, failures)
    elif light and _own(r.workflow):
        workflow, workflow_kwargs = None, {}
    else:
        workflow = _workflow(r.workflow, r.workflow_kwargs, problems)
        workflow_kwargs = _discount_kwarg(workflow, r, problems, [] if warns is None else warns)
    accept = None
    if r.dynamic_filter is not None and not (light and _own(r.dynamic_filter)):
        try:
            accept = resolve(r.dynamic_filter, "rollout.dynamic_filter")
        except PluginError as e:
            problems.append(str(e))
    if len(problems) > n or light:
        return None
    kwargs = dict(r.vllm_kwargs) if engine.extra_kwargs_key == "rollout.vllm_kwargs" else {}
    return RolloutParts(engine, kwargs, workflow, workflow_kwargs, accept, _agent_discount(r))


def _engine(cfg, problems: list[str], light: bool = False) -> EngineSpec | None:
    r = cfg.rollout
    name = r.backend
    if using_servers(cfg):
        return bind_servers(cfg, problems, light)
    if name not in ENGINES:
        problems += one_of("rollout.backend", name, tuple(ENGINES))
        return None
    spec = ENGINES[name]
    if cfg.parallel.fsdp and not spec.supports_fsdp:
        problems.append(f"rollout.backend={name} does not support a policy sharded with FSDP2 (parallel.fsdp=true) "
                        f"yet; use rollout.backend={_able('supports_fsdp')}, or parallel.fsdp=false.")
    lagged = r.max_head_offpolicyness > 0 and r.offpolicy_mode == "lagged"
    if lagged and r.lagged_switch_prob > 0 and not spec.can_switch_mid_call:
        problems.append(f"rollout.lagged_switch_prob > 0 needs a backend that can switch weights inside a generation "
                        f"call, which rollout.backend={name} cannot. Use "
                        f"rollout.backend={_able('can_switch_mid_call')} or rollout.lagged_switch_prob=0.")
    return spec


def _able(flag: str) -> str:
    return " or ".join(n for n, s in ENGINES.items() if getattr(s, flag))


def _own(path: Any) -> bool:
    """Whether an import path names something of this package."""
    return isinstance(path, str) and path.partition(":")[0].split(".")[0] == "areal_trainer"


def _agent(cfg, problems: list[str], light: bool, failures: FailurePolicy) -> tuple[type | None, dict[str, Any]]:
    """``rollout.agent`` as the agent workflow and its bound settings (``rollout/agents/workflow.py``; ``light``: only
    the checks, since that module imports torch)."""
    r = cfg.rollout
    n = len(problems)
    try:
        spec = load_agent(r.agent, dict(r.agent_kwargs))
        if type(r.agent_processes) is int and r.agent_processes > 0:  # a bad count is the config's own problem
            problem = agent_processes.check(spec, r.agent_processes)
            if problem:
                problems.append(problem)
    except PluginError as e:
        problems.append(str(e))
    try:
        get_parser(r.tool_call_parser)
    except ValueError as e:
        problems.append(str(e))
    if len(problems) > n or light:
        return None, {}
    from ..rollout.agents.workflow import AgentWorkflow

    return AgentWorkflow, dict(agent=spec, processes=r.agent_processes, **agent_settings(cfg, failures))


def agent_settings(cfg, failures: FailurePolicy) -> dict[str, Any]:
    """The agent workflow's settings from ``rollout.*`` and the run's failure policy, but the agent
    (``rollout/agents/workflow.py``)."""
    r = cfg.rollout
    return dict(failures=failures, export=r.agent_export, chat_template_type=r.chat_template_type,
                turn_discount=_agent_discount(r), tool_call_parser=r.tool_call_parser,
                batching=r.agent_batching, batch_wait=r.agent_batch_wait,
                max_calls=r.agent_max_calls, max_choices=r.agent_max_choices,
                max_concurrent=None if r.max_concurrent_rollouts is None
                else r.max_concurrent_rollouts * cfg.gconfig.n_samples)


def _environment(cfg, environment, problems: list[str], light: bool,
                 failures: FailurePolicy) -> tuple[type | None, dict[str, Any]]:
    """A multi-turn environment's episodes as the environment's agent workflow, with the agent's settings."""
    try:
        get_parser(cfg.rollout.tool_call_parser)
    except ValueError as e:
        problems.append(str(e))
    if light:
        return None, {}
    from ..environments.workflow import EnvironmentWorkflow

    return EnvironmentWorkflow, dict(environment=environment.adapter, **agent_settings(cfg, failures))


def _workflow(path: str, kwargs: dict, problems: list[str]) -> type | None:
    """A workflow class is built as ``cls(engine=..., tokenizer=..., reward=..., **rollout.workflow_kwargs)``
    and offers ``rollout(samples, gconfig)`` (the ``Workflow`` protocol)."""
    try:
        cls = resolve(path, "rollout.workflow", {"engine": None, "tokenizer": None, "reward": None, **kwargs},
                      n_positional=0, hidden=("engine", "tokenizer", "reward"), kwargs_key="rollout.workflow_kwargs")
    except PluginError as e:
        problems.append(str(e))
        return None
    fn = getattr(cls, "rollout", None)
    if not callable(fn):
        problems.append(f"rollout.workflow: {path!r} has no rollout(samples, gconfig) method; a workflow returns one "
                        "trajectory group per prompt from it (see areal_trainer.rollout.types.Workflow).")
        return None
    try:
        check_signature(fn, "rollout.workflow", {}, n_positional=3)  # self, samples, gconfig
    except PluginError:
        problems.append(f"rollout.workflow: {path}.rollout must take (samples, gconfig); it is {fn.__qualname__}"
                        f"{inspect.signature(fn)}.")
        return None
    return cls


def _agent_discount(r) -> float:
    return 1.0 if r.turn_discount is None else float(r.turn_discount)


def _discount_kwarg(cls: type | None, r, problems: list[str], warns: list[str]) -> dict[str, Any]:
    """``rollout.workflow_kwargs`` with ``rollout.turn_discount`` for a workflow class that takes
    ``turn_discount`` (see the module docstring)."""
    kwargs = dict(r.workflow_kwargs)
    try:
        takes = cls is not None and "turn_discount" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        return kwargs
    if "turn_discount" not in kwargs:
        if r.turn_discount is not None:
            kwargs["turn_discount"] = r.turn_discount
        return kwargs
    old = kwargs["turn_discount"]
    if r.turn_discount is not None and old != r.turn_discount:
        problems.append(f"rollout.workflow_kwargs.turn_discount={old!r} and rollout.turn_discount={r.turn_discount!r} "
                        "differ; rollout.turn_discount is the one discount key: drop "
                        "rollout.workflow_kwargs.turn_discount.")
    else:
        warns.append(f"rollout.workflow_kwargs.turn_discount is now rollout.turn_discount; set rollout.turn_discount: "
                     f"{old!r} and drop rollout.workflow_kwargs.turn_discount (the old place goes in a later release).")
    return kwargs
