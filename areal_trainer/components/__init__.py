"""Build once: a configuration bound to every component the trainer uses, checked in one round.

``build(cfg) -> Components`` runs the schema's rules (``config/validate.py``) and binds every plugin and
rule exactly once: the reward function, the workflow, the dynamic filter, the engine from the registry,
the advantage stages with their frozen settings, the policy loss, the policy plan. It loads no model
and no data, and raises one ``ConfigError`` listing every problem, each naming its key, the value and
the fix. Validation *is* this building; the trainer receives what was built and resolves nothing again.

``load("grpo", ["actor.eps_clip=0.3"])`` composes the config (as the command line does) and builds it.

The checks come in two parts. The light part imports neither torch nor transformers: the schema's rules
(``config/validate.py``), the reward, the verifier, the rollout's engine, agent, and the user's workflow and
filter, the teacher's rules, whether an environment's package is installed. The rest needs the modules it
checks against, which import torch: the advantage stages and the policy loss (their registries and rules
live with the maths), rejection sampling's rules, a reward model's files (``reward/model.py``), this
package's own workflows and filters, and an environment's id and kwargs (its package is imported).
``build`` runs both in one round; the command line runs the light part before Hydra starts
(:func:`early_problems`), and the whole only when that found nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from ..config.base import ConfigError
from ..config.data import DatasetConfig
from ..config.loader import compose_dict, convert
from ..config.overrides import CONFIG_GROUPS, normalize_overrides, split_overrides
from ..config.schema import TrainerConfig
from ..config.validate import collect
from ..plugins import PluginError
from .distill import DistillSpec, bind_distill, wrap_loss
from .environment import EnvironmentSpec, bind_environment
from .reward import RewardSpec, bind_reward
from .rollout import RolloutParts, bind_rollout
from .verifier import VerifierSpec, bind_verifier

if TYPE_CHECKING:  # the advantage and the loss import torch: the light checks do without them
    from ..advantage import AdvantageFn
    from ..loss import PolicyPlan


LATER_CHECKS = ("The policy loss, the advantage stages, rejection sampling, a reward model's files and this "
                "package's own workflows and filters are checked once these are fixed (they need torch).")
"""What the command line says under the problems of :func:`early_problems`: the checks it left out."""


@dataclass(frozen=True)
class Components:
    """A configuration and everything bound from it (see the module docstring).

    Attributes:
        config: the validated configuration (scalar settings the trainer reads directly).
        advantage: the advantage computation (stages and settings bound).
        loss: the policy loss (``PolicyLoss``, or a user's whole loss, checked at every call).
        plan: which log-probabilities a step computes (behaviour, proximal, recomputed).
        reward: the reward sources (functions, model, service) and how they combine; started by the run.
        rollout: the engine's registry entry, the workflow class and the dynamic filter.
        distill: see the attribute.
        valid_dataset: ``valid_dataset`` with train_dataset's prompt keys where its own are null, or None.
        warnings: what the checks found worth saying (issued by :func:`build` as ``UserWarning``).
    """

    config: TrainerConfig
    advantage: AdvantageFn
    loss: Callable
    plan: PolicyPlan
    reward: RewardSpec
    rollout: RolloutParts
    valid_dataset: DatasetConfig | None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    distill: DistillSpec | None = None
    """The teachers of on-policy distillation and how their term enters (None without ``teacher``); ``loss``
    then already holds the distillation term."""
    verifier: VerifierSpec | None = None
    """Where the held-out accuracy comes from, or what the held-out number is without one (``evaluator.verifier``)."""
    environment: EnvironmentSpec | None = None
    """The environment whose rows, scoring and episodes are the task (``environment.type``), or None."""


def _bind(fn: Callable, *args, problems: list[str]):
    try:
        return fn(*args)
    except (ConfigError, PluginError) as e:
        problems += getattr(e, "problems", [str(e)])
        return None


def problems_and_build(cfg: TrainerConfig, *, light: bool = False) -> tuple[list[str], list[str], Components | None]:
    """Every problem and warning of ``cfg``, and its components when there is no problem. ``light``: only
    the checks that import neither torch nor transformers (see the module docstring), and no components."""
    problems, warns = collect(cfg, light=light)
    environment = bind_environment(cfg, problems, light=light)
    reward = bind_reward(cfg.reward, problems, light=light, agent_timeout=cfg.rollout.agent_timeout,
                         environment=environment)
    verifier = bind_verifier(cfg, reward, problems, environment)
    rollout = bind_rollout(cfg, problems, light=light, warns=warns, failures=reward.failures if reward else None,
                           environment=environment)
    if not light:
        from .advantage import bind_advantage
        from .loss import bind_policy_loss, policy_plan

        advantage = _bind(bind_advantage, cfg.actor, problems=problems)
        loss = _bind(bind_policy_loss, cfg.actor, problems=problems)
    distill = bind_distill(cfg, problems)
    if problems or light:
        return problems, warns, None
    valid = cfg.valid_dataset.inheriting(cfg.train_dataset) if cfg.valid_dataset is not None else None
    return [], warns, Components(cfg, advantage, wrap_loss(loss, distill, cfg.actor), policy_plan(cfg.actor), reward,
                                 rollout, valid, tuple(warns), distill, verifier, environment)


def build(cfg: TrainerConfig) -> Components:
    """Bind ``cfg`` (see the module docstring); raises ``ConfigError`` listing every problem."""
    problems, warns, components = problems_and_build(cfg)
    if problems:
        raise ConfigError(problems)
    for w in warns:
        warnings.warn(w, UserWarning, stacklevel=2)
    return components


def load(config_name: str = "config", overrides: Sequence[str] = ()) -> Components:
    """Compose ``conf/<config_name>.yaml`` with ``overrides`` and build it, reporting every problem at once."""
    problems = override_problems(config_name, overrides)
    if problems:
        raise ConfigError(problems)
    return build(convert(compose_dict(config_name, normalize_overrides(list(overrides)))))


def load_config(config_name: str = "config", overrides: Sequence[str] = ()) -> TrainerConfig:
    """The validated configuration of :func:`load` (for reading settings; ``build`` it to train)."""
    return load(config_name, overrides).config


def override_problems(config_name: str | None, overrides: Sequence[str],
                      groups: frozenset[str] = frozenset(CONFIG_GROUPS)) -> list[str]:
    """Unknown keys and wrong types of ``overrides`` and, when there are any, every problem of the config
    ``config_name`` composed with those overrides left out, so that one round reports them all
    (``config_name=None``: only the overrides' own problems). ``groups``: the config groups an override
    may select (``conf/``'s and a ``--config-dir``'s). Composing creates no run directory."""
    problems, usable = split_overrides(normalize_overrides(list(overrides), groups), groups)
    if not problems or config_name is None:
        return problems
    return problems + _config_problems(config_name, usable, light=False)


def early_problems(config_name: str | None, overrides: Sequence[str],
                   groups: frozenset[str] = frozenset(CONFIG_GROUPS), *, whole: bool = True) -> list[str]:
    """What the command line reports before Hydra starts, without importing torch or transformers: the
    problems of ``overrides`` (as :func:`override_problems`) and those the light checks find in the config
    ``config_name`` composed with the usable ones. ``whole=False`` (a command line that only prints the
    config): the config's own problems only when the overrides have some."""
    problems, usable = split_overrides(normalize_overrides(list(overrides), groups), groups)
    if config_name is None or not (problems or whole):
        return problems
    return problems + _config_problems(config_name, usable, light=True)


def _config_problems(config_name: str, overrides: list[str], *, light: bool) -> list[str]:
    """The problems of the config ``config_name`` composed with ``overrides`` (each one usable)."""
    overrides = [a for a in overrides if not a.lstrip("+~").startswith("hydra")]  # Hydra's own settings do not matter
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # they are shown once the config is run
            return problems_and_build(convert(compose_dict(config_name, overrides)), light=light)[0]
    except ConfigError as e:
        return e.problems
    except (HydraException, OmegaConfBaseException) as e:
        return [str(e).strip()]


__all__ = ["LATER_CHECKS", "Components", "build", "early_problems", "load", "load_config", "override_problems"]
