"""Compose, convert and validate a configuration: the one path shared by the CLI and Python.

``load_config("grpo", ["actor.eps_clip=0.3"])`` gives the same ``TrainerConfig`` object the
command line ``python -m areal_trainer --config-name grpo actor.eps_clip=0.3`` trains with.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..plugins import PluginError, check_signature, import_object, resolve
from .base import ConfigError, deferred_validation
from .overrides import normalize_overrides, split_overrides
from .schema import TrainerConfig
from .store import register_configs
from .validate import collect

CONFIG_MODULE = "areal_trainer.conf"


def load_config(config_name: str = "config", overrides: Sequence[str] = ()) -> TrainerConfig:
    """Compose ``conf/<config_name>.yaml`` with Hydra-style ``overrides`` and validate it.

    Raises:
        ConfigError: listing every problem (unknown keys, wrong types, bad values, plugins).
    """
    args = normalize_overrides(list(overrides))
    problems = override_problems(config_name, args)
    if problems:
        raise ConfigError(problems)
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=args)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError([str(e).strip()]) from None
    return to_trainer_config(cfg)


def to_trainer_config(cfg: DictConfig) -> TrainerConfig:
    """Convert a composed ``DictConfig`` to ``TrainerConfig``; check every rule and plugin."""
    cfg = cfg.copy()
    if "hydra" in cfg:
        with_flag = OmegaConf.is_struct(cfg)
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
        OmegaConf.set_struct(cfg, with_flag)
    try:
        with deferred_validation():
            obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError([str(e).strip()]) from None
    problems, warns = collect(obj)
    problems = list(dict.fromkeys(problems + plugin_problems(obj)))  # stage rules are also re-checked by resolve_advantage
    if problems:
        raise ConfigError(problems)
    for w in warns:
        warnings.warn(w, UserWarning, stacklevel=2)
    return obj


def plugin_problems(cfg: TrainerConfig) -> list[str]:
    """Import every user function named in the config; one message per failure."""
    p: list[str] = []

    def attempt(path: str | None, key: str, kwargs: dict | None = None, n_positional: int = 1) -> None:
        if path is None:
            return
        try:
            resolve(path, key, kwargs, n_positional)
        except PluginError as e:
            p.append(str(e))

    attempt(cfg.reward.fn, "reward.fn", cfg.reward.kwargs, n_positional=3)
    # A workflow is built as cls(engine=..., tokenizer=..., reward=..., **rollout.workflow_kwargs).
    attempt(cfg.rollout.workflow, "rollout.workflow",
            {"engine": None, "tokenizer": None, "reward": None, **cfg.rollout.workflow_kwargs}, n_positional=0)
    p += _workflow_problems(cfg.rollout.workflow)
    attempt(cfg.rollout.dynamic_filter, "rollout.dynamic_filter")
    lam = cfg.actor.gae_lambda
    if isinstance(lam, str) and lam.strip():
        attempt(lam, "actor.gae_lambda", cfg.actor.gae_lambda_kwargs)
    p += advantage_problems(cfg) + loss_plugin_problems(cfg)
    return p


def _workflow_problems(path: str) -> list[str]:
    """The workflow class must offer ``rollout(samples, gconfig)`` (the ``Workflow`` protocol)."""
    try:
        cls = import_object(path, "rollout.workflow")
    except PluginError:
        return []  # reported by the import check
    fn = getattr(cls, "rollout", None)
    if not callable(fn):
        return [f"rollout.workflow: {path!r} has no rollout(samples, gconfig) method; a workflow returns one "
                "trajectory group per prompt from it (see areal_trainer.rollout.types.Workflow)."]
    try:
        check_signature(fn, "rollout.workflow", {}, n_positional=3)  # self, samples, gconfig
    except PluginError:
        return [f"rollout.workflow: {path}.rollout must take (samples, gconfig); it is {fn.__qualname__}"
                f"{inspect.signature(fn)}."]
    return []


def loss_plugin_problems(cfg: TrainerConfig) -> list[str]:
    """Bind the policy loss (its rules, and a surrogate or whole loss given by import path)."""
    from .loss import bind_policy_loss

    try:
        bind_policy_loss(cfg.actor)
    except ConfigError as e:
        return list(e.problems)
    return []


def advantage_problems(cfg: TrainerConfig) -> list[str]:
    """Resolve the advantage stages (built-in names and import paths) of ``actor.advantage``."""
    from ..advantage.stages import resolve_advantage

    try:
        resolve_advantage(cfg.actor)
    except (ConfigError, PluginError) as e:
        return list(getattr(e, "problems", [str(e)]))
    return []


def override_problems(config_name: str | None, overrides: Sequence[str]) -> list[str]:
    """Unknown keys and wrong types of ``overrides`` and, when there are any, every problem of the config
    ``config_name`` composed with those overrides left out, so that one round reports them all
    (``config_name=None``: only the overrides' own problems). Composing creates no run directory."""
    register_configs()
    problems, usable = split_overrides(normalize_overrides(list(overrides)))
    if not problems or config_name is None:
        return problems
    usable = [a for a in usable if not a.lstrip("+~").startswith("hydra")]  # Hydra's own settings do not matter
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # they are shown once the config is run
            with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
                cfg = compose(config_name=config_name, overrides=usable)
            to_trainer_config(cfg)
    except ConfigError as e:
        problems += e.problems
    except (HydraException, OmegaConfBaseException) as e:
        problems.append(str(e).strip())
    return list(dict.fromkeys(problems))
