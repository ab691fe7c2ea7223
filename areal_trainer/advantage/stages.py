"""Binding ``actor.advantage`` to functions, once, at start-up.

``resolve_advantage(actor_cfg)`` turns the config into one callable ``AdvantageInputs ->
AdvantageResult``: the default pipeline with its three stages bound (built-in names or import
paths, plus kwargs), or the user's full replacement. Every problem (unknown built-in, missing
module, error inside the module, missing attribute, non-callable, kwargs that do not fit, invalid
lambda parameters, and the config rules of ``actor.advantage``) is collected and raised together
as one ``ConfigError``; each message names the full config key.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ConfigError, one_of
from ..plugins import PluginError, check_signature, resolve
from . import lambda_fn
from .datatypes import AdvantageInputs, AdvantageResult
from .estimators import token_gae, turn_gae
from .gae import GAELambdaContext
from .pipeline import Stage, Stages, check_data, run_default
from .process import PROCESS_FUNCTIONS as PROCESS_FNS
from .process import process_stage_problems
from .reward import identity
from .validation import check_result, check_unmodified, tensor_versions

OUTCOME_FNS = {"identity": identity}
ESTIMATOR_FNS = {"token_gae": token_gae, "turn_gae": turn_gae}
# The names ``actor.advantage.<stage>.implementation`` accepts besides import paths ("auto": the default).
OUTCOME_BUILTINS = ("auto", *OUTCOME_FNS)
ESTIMATOR_BUILTINS = ("auto", *ESTIMATOR_FNS)
PROCESS_BUILTINS = ("auto", *PROCESS_FNS)
BASELINE_FNS: dict[str, Callable] = {}
"""Built-in group baselines besides ``auto`` (``reward_norm``); user ones come by import path."""
BASELINE_BUILTINS = ("auto", *BASELINE_FNS)
_LAMBDA_BUILTINS = (lambda_fn.constant_gae_lambda, lambda_fn.vapo_length_adaptive_gae,
                    lambda_fn.relative_position_gae_lambda)


class AdvantageFn:
    """The bound computation: call it with ``AdvantageInputs``; the result is validated."""

    def __init__(self, run: Callable[[AdvantageInputs], AdvantageResult], label: str, stages: Stages | None):
        self._run = run
        self.label = label
        self.stages = stages

    def __call__(self, inputs: AdvantageInputs) -> AdvantageResult:
        n_rows, width, device = check_data(inputs.data, inputs.meta)
        before = tensor_versions(inputs.data)
        result = self._run(inputs)
        check_unmodified(self.label, inputs.data, before)
        check_result(result, label=self.label, shape=(n_rows, width), device=device, trusted=self.stages is not None)
        return result

    def __repr__(self) -> str:
        return f"AdvantageFn({self.label})"


def resolve_advantage(actor_cfg, key: str = "actor") -> AdvantageFn:
    """Resolve ``{key}.advantage`` and ``{key}.gae_lambda``; raise ``ConfigError`` listing every problem."""
    adv = actor_cfg.advantage
    problems = adv.check(f"{key}.advantage") + process_stage_problems(key, actor_cfg)
    for name in ("compute", "outcome_reward_shaping", "estimator", "process_adv_shaping", "group_baseline"):
        stage = getattr(adv, name)
        if stage is not None:
            problems += stage.check(f"{key}.advantage.{name}")
    gae_lambda = _resolve_lambda(actor_cfg, key, problems)
    compute = adv.compute
    if compute is not None and compute.implementation not in ("default", "auto"):
        ck = f"{key}.advantage.compute.implementation"
        fn = _import(compute.implementation, ck, compute.kwargs, problems)
        if problems:
            raise ConfigError(_unique(problems))
        label = f"{key}.advantage.compute ({compute.implementation})"
        return AdvantageFn(lambda inputs: fn(inputs, **dict(compute.kwargs)), label, None)
    prefix = f"{key}.advantage"
    default_estimator = "turn_gae" if actor_cfg.gae_timestep_unit == "turn" else "token_gae"
    outcome = _bind(adv.outcome_reward_shaping, f"{prefix}.outcome_reward_shaping", OUTCOME_FNS, OUTCOME_BUILTINS,
                    "identity", problems)
    estimator = _bind(adv.estimator, f"{prefix}.estimator", ESTIMATOR_FNS, ESTIMATOR_BUILTINS, default_estimator,
                      problems)
    process = _bind(adv.process_adv_shaping, f"{prefix}.process_adv_shaping", PROCESS_FNS, PROCESS_BUILTINS, None,
                    problems)
    baseline = _bind(adv.group_baseline, f"{prefix}.group_baseline", BASELINE_FNS, BASELINE_BUILTINS, None, problems)
    if problems:
        raise ConfigError(_unique(problems))
    stages = Stages(outcome=outcome, estimator=estimator, process=process, gae_lambda=gae_lambda, baseline=baseline)
    return AdvantageFn(lambda inputs: run_default(inputs, stages), f"{prefix}.compute (default)", stages)


def _bind(cfg, key: str, fns: dict, names: tuple, auto: str | None, problems: list[str]) -> Stage | None:
    impl = "auto" if cfg is None else cfg.implementation
    kwargs = {} if cfg is None else dict(cfg.kwargs)
    if not isinstance(impl, str) or not impl:
        return None  # reported by StageConfig.check
    name = auto if impl == "auto" else impl
    if name is None:
        return None  # process 'auto': the mode is chosen per call
    if name in fns:
        if name != "gvpo":  # GVPO kwargs are checked, key by key, by the config rules
            try:
                check_signature(fns[name], f"{key}.kwargs", kwargs)
            except PluginError as e:
                problems.append(str(e))
        return Stage(label=f"{key} ({name})", fn=fns[name], kwargs=kwargs, builtin=True)
    if "." not in name:
        if name not in names:  # otherwise the config check already reported it
            problems += one_of(f"{key}.implementation", name, names, "Or give an import path 'package.module.function'.")
        return None
    fn = _import(name, f"{key}.implementation", kwargs, problems)
    return None if fn is None else Stage(label=f"{key} ({name})", fn=fn, kwargs=kwargs, builtin=False)


def _import(path: str, key: str, kwargs, problems: list[str]) -> Callable | None:
    try:
        return resolve(path, key, dict(kwargs or {}), n_positional=1)
    except PluginError as e:
        problems.append(str(e))
        return None


def _resolve_lambda(actor_cfg, key: str, problems: list[str]) -> Any:
    lam = actor_cfg.gae_lambda
    if not isinstance(lam, str) or not lam.strip():
        return lam  # numbers (and bad types) are the config layer's
    kwargs = dict(actor_cfg.gae_lambda_kwargs)
    fn = _import(lam, f"{key}.gae_lambda", kwargs, problems)
    if fn in _LAMBDA_BUILTINS:  # their parameter checks are known now: probe them on an empty context
        empty = torch.zeros(1)
        try:
            fn(GAELambdaContext(empty, empty, empty), **kwargs)
        except (ValueError, TypeError) as e:
            problems.append(f"{key}.gae_lambda_kwargs: {e}")
    return fn


def _unique(problems: list[str]) -> list[str]:
    return list(dict.fromkeys(problems))


_BOUND: dict[int, tuple[weakref.ref, AdvantageFn]] = {}


def compute_advantages(inputs: AdvantageInputs) -> AdvantageResult:
    """The computation ``inputs.config`` selects (bound once per config object)."""
    cfg = inputs.config
    key = id(cfg)
    hit = _BOUND.get(key)
    if hit is None or hit[0]() is not cfg:
        fn = resolve_advantage(cfg)
        _BOUND[key] = (weakref.ref(cfg, lambda _: _BOUND.pop(key, None)), fn)
        return fn(inputs)
    return hit[1](inputs)
