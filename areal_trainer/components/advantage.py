"""Binding ``actor.advantage`` (and the actor's reward and GAE keys) to the advantage maths, once.

``bind_advantage(actor_cfg)`` returns one :class:`~areal_trainer.advantage.AdvantageFn`: the default
pipeline with its stages bound (built-in names or import paths, plus kwargs) and its settings frozen
into an :class:`~areal_trainer.advantage.AdvantageSettings`, or the user's full replacement. Which
stage AReaL's flat keys select (``gae_timestep_unit``, ``reward_norm``) is decided in
``config/areal_keys.py``. Every problem (unknown built-in, missing module, error inside the module,
missing attribute, non-callable, kwargs that do not fit, invalid lambda parameters, the rules of the
built-in process stages) is collected and raised together as one ``ConfigError``, each message naming
the full config key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..advantage import lambda_fn
from ..advantage.gae import GAELambdaContext
from ..advantage.pipeline import Stage, Stages, run_default
from ..advantage.process import GVPO_DEFAULTS
from ..advantage.settings import AdvantageSettings, norm_of
from ..advantage.stages import BUILTINS, AdvantageFn
from ..config.areal_keys import StageChoice, baseline_choice, estimator_choice
from ..errors import ConfigError, number_in, one_of, suggest
from ..plugins import PluginError, check_signature, resolve

_LAMBDA_BUILTINS = (lambda_fn.constant_gae_lambda, lambda_fn.vapo_length_adaptive_gae,
                    lambda_fn.relative_position_gae_lambda)


def advantage_settings(actor) -> AdvantageSettings:
    """The settings the built-in stages read, from the actor keys of the same names."""
    return AdvantageSettings(
        reward_bias=float(actor.reward_bias), reward_scaling=float(actor.reward_scaling),
        reward_clip=float(actor.reward_clip), reward_norm=norm_of(actor.reward_norm),
        overlong_reward_penalty=bool(actor.overlong_reward_penalty), overlong_tokens=actor.overlong_tokens,
        overlong_penalty_factor=actor.overlong_penalty_factor, max_new_tokens=int(actor.max_new_tokens),
        mask_no_eos_with_zero=bool(actor.mask_no_eos_with_zero), kl_ctl=float(actor.kl_ctl),
        kl_estimator=actor.kl_estimator, discount=float(actor.discount),
        gae_lambda_kwargs=dict(actor.gae_lambda_kwargs), gae_timestep_unit=actor.gae_timestep_unit,
        adv_norm=norm_of(actor.adv_norm), token_rewards_as_adv=bool(actor.token_rewards_as_adv))


def bind_advantage(actor_cfg, key: str = "actor") -> AdvantageFn:
    """Bind ``{key}.advantage`` and ``{key}.gae_lambda``; raise ``ConfigError`` listing every problem."""
    problems: list[str] = []
    gae_lambda = _resolve_lambda(actor_cfg, key, problems)
    compute = actor_cfg.advantage.compute
    if compute is not None and compute.implementation not in ("default", "auto"):
        ck = f"{key}.advantage.compute.implementation"
        fn = _import(compute.implementation, ck, compute.kwargs, problems)
        if problems:
            raise ConfigError(problems)
        kwargs = dict(compute.kwargs)
        return AdvantageFn(lambda inputs: fn(inputs, **kwargs), f"{key}.advantage.compute ({compute.implementation})",
                           None)
    prefix = f"{key}.advantage"
    adv = actor_cfg.advantage

    def choice(name: str) -> StageChoice:
        stage = getattr(adv, name)
        impl = "auto" if stage is None else stage.implementation
        return StageChoice(impl, {} if stage is None else dict(stage.kwargs), f"{prefix}.{name}.implementation")

    outcome = choice("outcome_reward_shaping")
    if outcome.name == "auto":
        outcome = StageChoice("identity", outcome.kwargs, outcome.key)
    baseline, _ = baseline_choice(actor_cfg, key)
    process = choice("process_adv_shaping")
    problems += _process_problems(process, actor_cfg, key)
    stages = Stages(
        outcome=_bind("outcome_reward_shaping", outcome, problems),
        estimator=_bind("estimator", estimator_choice(actor_cfg, key), problems),
        process=None if process.name == "auto" else _bind("process_adv_shaping", process, problems),
        gae_lambda=gae_lambda,
        baseline=None if baseline is None else _bind("group_baseline", baseline, problems),
        settings=advantage_settings(actor_cfg))
    if problems:
        raise ConfigError(problems)
    return AdvantageFn(lambda inputs: run_default(inputs, stages), f"{prefix}.compute (default)", stages)


def _bind(stage: str, choice: StageChoice, problems: list[str]) -> Stage | None:
    """A stage from its choice: a built-in (with what it declares) or an imported user function."""
    label = f"{choice.key.rsplit('.', 1)[0]} ({choice.name})"
    kwargs_key = f"{choice.key.rsplit('.', 1)[0]}.kwargs"
    builtin = BUILTINS[stage].get(choice.name)
    if builtin is not None:
        if not builtin.takes_prm_params:  # GVPO's kwargs are checked key by key (_process_problems)
            try:
                check_signature(builtin.fn, kwargs_key, choice.kwargs)
            except PluginError as e:
                problems.append(str(e))
        return Stage(label=label, fn=builtin.fn, kwargs=choice.kwargs, builtin=True,
                     reads_turn_ids=builtin.reads_turn_ids, takes_prm_params=builtin.takes_prm_params)
    if not choice.is_path:
        problems += one_of(choice.key, choice.name, ("auto", *BUILTINS[stage]),
                           "Or give an import path 'package.module.function'.")
        return None
    fn = _import(choice.name, choice.key, choice.kwargs, problems)
    return None if fn is None else Stage(label=label, fn=fn, kwargs=choice.kwargs, builtin=False)


def _process_problems(choice: StageChoice, actor, key: str) -> list[str]:
    """The rules of the built-in process stages (``gvpo``, ``process_weighted``) on the actor keys."""
    prefix = f"{key}.advantage.process_adv_shaping"
    if choice.name not in ("gvpo", "process_weighted"):
        return []
    p = []
    if not actor.token_rewards_as_adv:
        p.append(f"{prefix}.implementation={choice.name!r} requires {key}.token_rewards_as_adv=true.")
    if choice.name == "process_weighted" and actor.mask_no_eos_with_zero:
        p.append(f"{prefix}.implementation='process_weighted' requires {key}.mask_no_eos_with_zero=false.")
    if choice.name == "gvpo":
        for name, v in choice.kwargs.items():
            if name not in GVPO_DEFAULTS:
                p.append(f"{prefix}.kwargs.{name}: not a GVPO parameter.{suggest(name, GVPO_DEFAULTS)} Accepted: "
                         f"{', '.join(GVPO_DEFAULTS)}.")
            else:
                p += number_in(f"{prefix}.kwargs.{name}", v, 0, finite=True)
    return p


def _import(path: str, key: str, kwargs, problems: list[str]) -> Callable | None:
    try:
        return resolve(path, key, dict(kwargs or {}), n_positional=1)
    except PluginError as e:
        problems.append(str(e))
        return None


def _resolve_lambda(actor_cfg, key: str, problems: list[str]) -> Any:
    """``gae_lambda``: a number as it is, an import path resolved (a built-in's parameters probed now)."""
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
