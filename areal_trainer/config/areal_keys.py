"""AReaL's flat keys that choose a stage, each turned into the one stage it selects, with their conflicts.

AReaL spells some choices as flags and enums on the actor (``use_sapo_loss``, ``use_cispo_loss``,
``gae_timestep_unit``, ``reward_norm``); this trainer also has pluggable stages for them
(``actor.loss.surrogate``, ``actor.advantage.estimator``, ``actor.advantage.group_baseline``). Both
spellings are accepted, and this module is the one place that decides which stage runs. Everything
downstream (``components/``) sees only the resulting :class:`StageChoice`; no other module reads the
flat keys to pick a stage. Contradicting combinations are problems here, with the fix.

The same holds for the two keys that AReaL writes twice, on the actor and in ``gconfig``
(``temperature``, ``max_new_tokens``): :func:`duplicate_key_warnings` says when they disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StageChoice:
    """The stage a configuration selects: a built-in name or an import path, its kwargs, and the key that
    chose it (for messages)."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    key: str = ""

    @property
    def is_path(self) -> bool:
        return "." in self.name


def _stage(stage, key: str) -> tuple[str, dict]:
    if stage is None:
        return "auto", {}
    return stage.implementation, dict(stage.kwargs)


def surrogate_choice(actor, key: str = "actor") -> tuple[StageChoice, list[str]]:
    """The policy-loss surrogate: ``{key}.loss.surrogate`` when set, else the flag that is on
    (``use_sapo_loss``: SAPO, ``use_cispo_loss``: CISPO), else ``clip``."""
    impl, kwargs = _stage(actor.loss.surrogate, key)
    flags = [(f, name) for f, name, on in (("use_sapo_loss", "sapo", actor.use_sapo_loss),
                                           ("use_cispo_loss", "cispo", actor.use_cispo_loss)) if on]
    problems = []
    if len(flags) > 1:
        problems.append(f"{' and '.join(f'{key}.{f}=true' for f, _ in flags)} select two surrogates; set only one.")
    if impl == "auto":
        name, where = (flags[0][1], f"{key}.{flags[0][0]}") if flags else ("clip", f"{key}.loss.surrogate")
        return StageChoice(name, kwargs, where), problems
    for f, name in flags:
        if impl != name:
            problems.append(f"{key}.{f}=true conflicts with {key}.loss.surrogate.implementation={impl!r}; set "
                            f"{key}.{f}=false, or the surrogate to {name}.")
    return StageChoice(impl, kwargs, f"{key}.loss.surrogate.implementation"), problems


def estimator_choice(actor, key: str = "actor") -> StageChoice:
    """The temporal estimator: ``{key}.advantage.estimator`` when set, else GAE over ``gae_timestep_unit``."""
    impl, kwargs = _stage(actor.advantage.estimator, key)
    if impl == "auto":
        return StageChoice("turn_gae" if actor.gae_timestep_unit == "turn" else "token_gae", kwargs,
                           f"{key}.gae_timestep_unit")
    return StageChoice(impl, kwargs, f"{key}.advantage.estimator.implementation")


def baseline_choice(actor, key: str = "actor") -> tuple[StageChoice | None, list[str]]:
    """The group-baseline stage in place of ``reward_norm`` (None: ``reward_norm`` acts), and a warning
    when both are set (the stage wins)."""
    impl, kwargs = _stage(actor.advantage.group_baseline, key)
    if impl == "auto":
        return None, []
    warns = []
    norm = actor.reward_norm
    if norm is not None and (norm.mean_level is not None or norm.std_level is not None):
        warns.append(f"{key}.advantage.group_baseline={impl!r} replaces {key}.reward_norm, which is ignored.")
    return StageChoice(impl, kwargs, f"{key}.advantage.group_baseline.implementation"), warns


def duplicate_key_warnings(cfg) -> list[str]:
    """AReaL keys written both on the actor and in ``gconfig``, when they disagree where it matters."""
    a, g, w = cfg.actor, cfg.gconfig, []
    if abs(a.temperature - g.temperature) > 1e-9 and not g.greedy:
        w.append(f"actor.temperature={a.temperature} differs from gconfig.temperature={g.temperature}: "
                 "the training log-probabilities then do not match the sampling policy.")
    if a.max_new_tokens != g.max_new_tokens and (a.overlong_reward_penalty
                                                 or a.loss_agg_mode == "seq-mean-token-sum-norm"):
        w.append(f"actor.max_new_tokens={a.max_new_tokens} differs from gconfig.max_new_tokens="
                 f"{g.max_new_tokens}; set actor.max_new_tokens=${{gconfig.max_new_tokens}}.")
    return w
