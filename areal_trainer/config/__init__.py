"""Configuration: the typed schema (one module per group of sections), the key index, YAML composition,
the checks of overrides and the schema's rules. Binding a configuration to the components that use it
(plugins, the loss, the advantage stages, the engine) is ``areal_trainer.components``:

>>> from areal_trainer.components import load
>>> components = load("grpo", ["actor.eps_clip=0.3"])   # doctest: +SKIP
>>> components.config.actor.eps_clip                    # doctest: +SKIP
0.3
"""

from .actor import PPOActorConfig, PPOCriticConfig
from .base import ConfigError
from .loader import compose_config, to_trainer_config
from .parts import (
    AdvantageConfig,
    MicroBatchSpec,
    NormConfig,
    OptimizerConfig,
    RejectionSamplingConfig,
    StageConfig,
)
from .schema import DatasetConfig, GenerationHyperparameters, TrainerConfig

__all__ = [
    "AdvantageConfig",
    "ConfigError",
    "DatasetConfig",
    "GenerationHyperparameters",
    "MicroBatchSpec",
    "NormConfig",
    "OptimizerConfig",
    "PPOActorConfig",
    "PPOCriticConfig",
    "RejectionSamplingConfig",
    "StageConfig",
    "TrainerConfig",
    "compose_config",
    "to_trainer_config",
]
