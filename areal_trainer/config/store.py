"""Register the schema with Hydra's ConfigStore, so YAML files are typed by ``base_config``."""

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from .schema import TrainerConfig

_DONE = [False]


def register_configs() -> None:
    if _DONE[0]:
        return
    ConfigStore.instance().store(name="base_config", node=TrainerConfig)
    # ``${eighth:${gconfig.max_new_tokens}}``: DAPO's overlong zone is the last eighth of the budget.
    OmegaConf.register_new_resolver("eighth", lambda n: max(1, int(n) // 8), replace=True)
    _DONE[0] = True
