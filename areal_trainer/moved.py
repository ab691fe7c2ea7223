"""Module paths that moved (in the rollout/ and train/ split; the multi-turn workflow into the agents),
importable under their old names for one release: a config's plugin path
(``rollout.workflow=areal_trainer.rollout.workflows.multi_turn.MultiTurnWorkflow``), a user's
``from areal_trainer.rollout.agent_client import ...`` and a pickle that names an old module all get the
module at its new path, with one :class:`MovedModuleWarning` naming that path.

The old name is an alias, not a copy: ``sys.modules`` holds the one module under both names, so its
classes and functions are the same objects whichever name imported them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

_P = "areal_trainer."
MOVED = {_P + old: _P + new for old, new in {
    "rollout.engine": "rollout.engines.hf",
    "rollout.vllm_engine": "rollout.engines.vllm",
    "rollout.batcher": "rollout.engines.batcher",
    "rollout.weights": "rollout.engines.weights",
    "rollout.backends": "rollout.engines.backends",
    "rollout.stops": "rollout.engines.stops",
    "rollout.agent": "rollout.agents.workflow",
    "rollout.agent_client": "rollout.agents.session",
    "rollout.agent_spec": "rollout.agents.spec",
    "rollout.server": "rollout.agents.endpoint",
    "rollout.openai_request": "rollout.agents.requests",
    "rollout.openai_types": "rollout.agents.openai_types",
    "rollout.tools": "rollout.agents.tools",
    "rollout.tool_parsers": "rollout.agents.tool_parsers",
    "rollout.episodes": "rollout.agents.episodes",
    "rollout.trajectory": "rollout.agents.trajectory",
    "rollout.workflow": "rollout.workflows.single_turn",
    "rollout.multiturn": "rollout.agents.multi_turn",
    "rollout.workflows.multi_turn": "rollout.agents.multi_turn",
    "rollout.batch": "rollout.rows",
    "train.policy_model": "train.models.policy",
    "train.critic_model": "train.models.critic",
    "train.logprobs": "train.models.logprobs",
    "train.optim": "train.models.optim",
    "train.update": "train.models.update",
    "train.teacher": "train.models.teacher",
    "train.async_rollout": "train.sources.concurrent",
    "train.lagged": "train.sources.lagged",
    "train.collect": "train.sources.collect",
    "train.checkpoint": "train.state.checkpoint",
    "train.manifest": "train.state.manifest",
    "train.resume": "train.state.resume",
}.items()}
"""Old dotted module name -> new one. (``train.models`` and ``train.sources`` are packages now; their
contents are in ``models/build.py`` and ``sources/build.py``.)"""
MOVED_NAMES = {"areal_trainer.rollout.agent_client.AgentClient": "areal_trainer.rollout.agents.client.AgentClient",
               "areal_trainer.rollout.agent_client.SyncAgentClient":
                   "areal_trainer.rollout.agents.client.SyncAgentClient",
               "areal_trainer.rollout.agent_client.template_message": "areal_trainer.model.chat.template_message"}
"""Names that left their module in the move: old ``module.name`` -> new one."""


class MovedModuleWarning(FutureWarning):
    """An import named a module path that moved; shown by default, once per place."""


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new
        self.spec = None

    def create_module(self, spec) -> ModuleType:
        warnings.warn(f"{spec.name} is now {self.new}; the old path is an alias that goes in the next release.",
                      MovedModuleWarning, stacklevel=_importer_level())
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        _add_moved_names(module, spec.name)
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set the alias's spec on the one module


def _importer_level() -> int:
    """The ``stacklevel`` that points a warning raised in ``create_module`` at the line that imported: the
    warnings module skips the import system's ``_bootstrap`` frames itself and counts the others, so the
    other ``importlib`` frames (``import_module``) are counted here and passed over."""
    frame, level = sys._getframe(2), 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            level += 1
            if "importlib" not in name:
                return level
        frame = frame.f_back
    return level


def _add_moved_names(module: ModuleType, old: str) -> None:
    """``from <old> import <name>`` keeps working for the names that moved to another module."""
    for full, new in MOVED_NAMES.items():
        mod, name = full.rsplit(".", 1)
        if mod == old and not hasattr(module, name):
            new_mod, new_name = new.rsplit(".", 1)
            setattr(module, name, getattr(importlib.import_module(new_mod), new_name))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Make the old paths importable (idempotent; the package does it on import)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
