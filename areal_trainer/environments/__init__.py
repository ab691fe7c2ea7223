"""Environments from the hubs as the task (``environment.type``): verifiers tasksets, reasoning-gym tasks,
Gymnasium and OpenEnv environments. One adapter per type (``verifiers_env.py``, ``reasoning_gym_env.py``,
``gym_env.py``, ``openenv_env.py``; what they share: ``base.py``) gives the rows and scores them with the
environment's own scoring: single-turn rows through the reward service (``reward.py``: the source
``environment``), multi-turn episodes as agents (``agent.py``, ``workflow.py``; games: ``turns.py``; verifiers
tools: ``verifiers_tools.py``). The binding is ``components/environment.py``; docs/environments.md.

Each type's package is an optional extra (:data:`EXTRAS`); :func:`missing` says which one to install.
"""

from __future__ import annotations

import importlib
import importlib.util

from .base import EnvironmentFailure, Settings

ADAPTERS = {"verifiers": ("verifiers_env", "VerifiersEnvironment"),
            "reasoning_gym": ("reasoning_gym_env", "ReasoningGymEnvironment"),
            "gym": ("gym_env", "GymEnvironment"),
            "openenv": ("openenv_env", "OpenEnvEnvironment")}
PACKAGES = {"verifiers": ("verifiers.v1", "verifiers>=0.4"), "reasoning_gym": ("reasoning_gym", "reasoning-gym"),
            "gym": ("gymnasium", "gymnasium>=1.0"), "openenv": ("openenv.core", "openenv-core")}
"""Per type: the module it imports and the requirement that provides it."""
EXTRAS = {"verifiers": "envs-verifiers", "reasoning_gym": "envs-reasoning-gym", "gym": "envs-gym",
          "openenv": "envs-openenv"}
"""The optional extra of ``pyproject.toml`` with each type's package (``envs`` has them all)."""


def missing(kind: str) -> str | None:
    """What to install when ``kind``'s package is not importable here, else None."""
    module, requirement = PACKAGES[kind]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # the parent package is missing (or half-installed)
        found = False
    if found:
        return None
    return (f"environment.type={kind} needs the {requirement} package (import {module}), which is not installed: "
            f"pip install -e '.[{EXTRAS[kind]}]' (or '.[envs]' for every environment type).")


def load(settings: Settings):
    """The adapter of ``settings.type`` loaded for ``settings.id``; :class:`EnvironmentFailure` when the id
    does not exist or its kwargs do not fit."""
    module, name = ADAPTERS[settings.type]
    cls = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return cls(settings)


__all__ = ["ADAPTERS", "EXTRAS", "PACKAGES", "EnvironmentFailure", "Settings", "load", "missing"]
