"""Register the schema with Hydra's ConfigStore, so YAML files are typed by ``base_config``."""

import dataclasses
import typing

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from .base import deferred_validation
from .schema import TrainerConfig

_DONE = [False]


def register_configs() -> None:
    if _DONE[0]:
        return
    with deferred_validation():  # the defaults are valid; checking them would import the maths (torch)
        ConfigStore.instance().store(name="base_config", node=TrainerConfig)
    # ``${eighth:${gconfig.max_new_tokens}}``: DAPO's overlong zone is the last eighth of the budget.
    OmegaConf.register_new_resolver("eighth", lambda n: max(1, int(n) // 8), replace=True)
    OmegaConf.update = staticmethod(_update_filling_null_sections)
    _DONE[0] = True


def _null_section_class(node):
    """The dataclass of a structured config node whose value is null, else None."""
    if not isinstance(node, DictConfig) or not node._is_none():
        return None
    ref = node._metadata.ref_type
    args = [a for a in typing.get_args(ref) if a is not type(None)] or [ref]
    return args[0] if dataclasses.is_dataclass(args[0]) else None


def _update_filling_null_sections(cfg, key, value=None, *, merge=True, force_add=False):
    """``OmegaConf.update`` that first turns null sections on the path into their defaults.

    OmegaConf 2.3 cannot set ``actor.reward_norm.mean_level=group`` (or merge a dict) when
    ``actor.reward_norm`` is null: it fails with an internal assertion. A null section named on the
    command line is therefore first filled with its dataclass defaults, then updated.
    """
    parts = key.split(".")
    upto = len(parts) if (merge and isinstance(value, dict)) else len(parts) - 1
    for i in range(1, upto + 1):
        prefix = ".".join(parts[:i])
        parent = OmegaConf.select(cfg, ".".join(parts[: i - 1])) if i > 1 else cfg
        if not isinstance(parent, DictConfig) or parts[i - 1] not in parent:
            break
        cls = _null_section_class(parent._get_node(parts[i - 1]))
        if cls is not None:
            with deferred_validation():
                _ORIGINAL_UPDATE(cfg, prefix, OmegaConf.structured(cls), merge=False)
    return _ORIGINAL_UPDATE(cfg, key, value, merge=merge, force_add=force_add)


_ORIGINAL_UPDATE = OmegaConf.update
