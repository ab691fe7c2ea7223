"""Configuration: the typed schema, YAML composition and validation.

>>> from areal_trainer.config import load_config
>>> cfg = load_config("grpo", ["actor.eps_clip=0.3"])   # doctest: +SKIP
"""

from .actor import PPOActorConfig, PPOCriticConfig
from .base import ConfigError
from .loader import load_config, to_trainer_config
from .parts import (
    AdvantageConfig,
    MicroBatchSpec,
    NormConfig,
    OptimizerConfig,
    RejectionSamplingConfig,
    StageConfig,
)
from .schema import GenerationHyperparameters, TrainerConfig

__all__ = [
    "AdvantageConfig",
    "ConfigError",
    "GenerationHyperparameters",
    "MicroBatchSpec",
    "NormConfig",
    "OptimizerConfig",
    "PPOActorConfig",
    "PPOCriticConfig",
    "RejectionSamplingConfig",
    "StageConfig",
    "TrainerConfig",
    "load_config",
    "to_trainer_config",
]
