"""Register the schema with Hydra's ConfigStore, so YAML files are typed by ``base_config``; and let a
command-line override reach into a section that is null in the YAML.

OmegaConf 2.3 cannot set ``actor.reward_norm.mean_level=group`` when ``actor.reward_norm`` is null
(it fails with an internal assertion). Hydra has no setting for this, so the one step of Hydra that
applies command-line overrides (``ConfigLoaderImpl._apply_overrides_to_config``, hydra-core 1.3)
is wrapped: before it runs, every null section on an override's path is replaced by its dataclass
defaults. Nothing else is changed; ``tests/config/test_compose.py`` checks the wrapped function is
still where it was and behaves as expected with the pinned Hydra.
"""

import dataclasses
import typing

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict

from .schema import TrainerConfig

_DONE = [False]


def register_configs() -> None:
    if _DONE[0]:
        return
    ConfigStore.instance().store(name="base_config", node=TrainerConfig)
    # ``${eighth:${gconfig.max_new_tokens}}``: DAPO's overlong zone is the last eighth of the budget.
    OmegaConf.register_new_resolver("eighth", lambda n: max(1, int(n) // 8), replace=True)
    # ``${answer_tokens:${rollout.agent},${environment.type}}``: the default answer budget, room for a tool call
    # in agent and environment runs.
    OmegaConf.register_new_resolver("answer_tokens", answer_tokens, replace=True)
    # ``${default_reward:${environment.type}}``: reward.fn's default, the environment's own scoring with one.
    OmegaConf.register_new_resolver("default_reward", default_reward, replace=True)
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(_apply_overrides_filling_null_sections)
    _DONE[0] = True


WORKFLOW_NEW_TOKENS = 16
"""The default ``gconfig.max_new_tokens`` of workflows: the built-in task's answers need about 10 tokens."""
AGENT_NEW_TOKENS = 256
"""The default ``gconfig.max_new_tokens`` of agent runs: a tool call (its JSON, with some text around it)
takes 30 to 100 tokens, which 16 would cut."""


def answer_tokens(agent, environment=None) -> int:
    """The default answer budget for a run whose ``rollout.agent`` is ``agent`` and ``environment.type``
    ``environment``."""
    return WORKFLOW_NEW_TOKENS if agent is None and environment is None else AGENT_NEW_TOKENS


DEFAULT_REWARD = "areal_trainer.reward.math.gsm8k_reward_fn"


def default_reward(environment) -> str:
    """``reward.fn``'s default: the built-in task's check, or ``environment`` (the environment's own scoring)."""
    return DEFAULT_REWARD if environment is None else "environment"


def _null_section_class(node):
    """The dataclass of a structured config node whose value is null, else None."""
    if not isinstance(node, DictConfig) or not node._is_none():
        return None
    ref = node._metadata.ref_type
    args = [a for a in typing.get_args(ref) if a is not type(None)] or [ref]
    return args[0] if dataclasses.is_dataclass(args[0]) else None


def _new_dict_element(parent, name: str) -> bool:
    """Create ``parent[name]`` with its dataclass defaults when ``parent`` is a ``Dict[str, <dataclass>]``
    (``teacher.teachers``) that lacks it: OmegaConf 2.3 refuses to create one from a plain dict, so
    ``teacher.teachers.math.path=x`` would fail. Returns whether it did."""
    element = getattr(parent._metadata, "element_type", None) if isinstance(parent, DictConfig) else None
    if name in parent or not dataclasses.is_dataclass(element) or parent._is_none():
        return False
    with open_dict(parent):  # Hydra composes in struct mode: a new key needs the flag lifted
        parent[name] = OmegaConf.structured(element)
    return True


def fill_null_sections(cfg: DictConfig, key: str, value) -> None:
    """Replace every null structured section on the path of ``key`` (including ``key`` itself when a
    dict is merged into it) by its dataclass defaults."""
    parts = key.split(".")
    upto = len(parts) if isinstance(value, dict) else len(parts) - 1
    for i in range(1, upto + 1):
        prefix = ".".join(parts[:i])
        parent = OmegaConf.select(cfg, ".".join(parts[: i - 1])) if i > 1 else cfg
        if isinstance(parent, DictConfig) and _new_dict_element(parent, parts[i - 1]):
            continue
        if not isinstance(parent, DictConfig) or parts[i - 1] not in parent:
            break
        cls = _null_section_class(parent._get_node(parts[i - 1]))
        if cls is not None:
            OmegaConf.update(cfg, prefix, OmegaConf.structured(cls), merge=False)


def _apply_overrides_filling_null_sections(overrides, cfg: DictConfig) -> None:
    for override in overrides:
        if override.package is None and not override.is_delete():
            fill_null_sections(cfg, override.key_or_group, override.value())
    return _ORIGINAL_APPLY(overrides, cfg)


_ORIGINAL_APPLY = ConfigLoaderImpl._apply_overrides_to_config
