"""Compose and convert a configuration, and check the overrides of a command line.

``compose_config("grpo", ["actor.eps_clip=0.3"])`` gives the ``TrainerConfig`` the command line
``python -m areal_trainer --config-name grpo actor.eps_clip=0.3`` composes, with the rules of the
schema checked (``validate.py``). Building the components from it (``components.build``) checks the
rest in the same way; ``components.load`` does both, which is what the command line runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .base import ConfigError
from .overrides import normalize_overrides, split_overrides
from .schema import TrainerConfig
from .store import register_configs
from .validate import collect

CONFIG_MODULE = "areal_trainer.conf"


def compose_dict(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """Hydra's composition of ``conf/<config_name>.yaml`` with ``overrides`` (creates no run directory)."""
    register_configs()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError([str(e).strip()]) from None


def compose_config(config_name: str = "config", overrides: Sequence[str] = ()) -> TrainerConfig:
    """Compose ``conf/<config_name>.yaml`` with Hydra-style ``overrides`` and check the schema's rules.

    Raises:
        ConfigError: listing every problem of the overrides, or else of the composed config.
    """
    args = normalize_overrides(list(overrides))
    problems, _ = split_overrides(args)
    if problems:
        raise ConfigError(problems)
    return to_trainer_config(compose_dict(config_name, args))


def convert(cfg: DictConfig) -> TrainerConfig:
    """The ``TrainerConfig`` of a composed ``DictConfig`` (Hydra's own ``hydra`` node left out), unchecked."""
    cfg = cfg.copy()
    if "hydra" in cfg:
        with_flag = OmegaConf.is_struct(cfg)
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
        OmegaConf.set_struct(cfg, with_flag)
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError([str(e).strip()]) from None


def to_trainer_config(cfg: DictConfig) -> TrainerConfig:
    """Convert a composed ``DictConfig`` and check the schema's rules; warnings are issued."""
    obj = convert(cfg)
    problems, warns = collect(obj)
    if problems:
        raise ConfigError(problems)
    for w in warns:
        warnings.warn(w, UserWarning, stacklevel=2)
    return obj
