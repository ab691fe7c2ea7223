"""Binding ``evaluator.verifier`` once: which reward source's verdict is the held-out accuracy, or why
there is none and what the held-out number is instead.

A verifier is a reward source whose value says right or wrong. In order:

* ``evaluator.verifier=<function>`` (import path or name of one of ``reward.fn``'s): that function's own
  values, correct when positive, or by the verdict the function declares (``reward.VERDICT``);
  ``evaluator.verifier=none``: no accuracy;
* null (auto): the one built-in verifier among ``reward.fn`` (it declares its verdict); else the only
  reward source, when it is a function and every value it gives on the held-out set is 0 or 1; an agent
  run's episode reward likewise (before ``rollout.turn_discount``);
* a reward model, a scoring service, or a weighted mix with no verifier among its sources: none;
* an environment (``environment.type``): a single-turn one's own scoring (the source ``environment``), by the
  verdict its adapter declares (reasoning-gym: a score of 1) or, without one, when every held-out value is 0
  or 1; a multi-turn one's episode rewards, as an agent run's.

With several sources the accuracy reads the verifier's own values (``TrajectoryGroup.source_values``),
never the weighted sum. Nothing here looks at data: the 0-or-1 rule is applied by the evaluation
(``train/evaluate.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..reward import verdict_of
from ..reward.service import unique_names
from .reward import RewardSpec

NONE = "none"
"""``evaluator.verifier=none``: the run reports no held-out accuracy."""
ENVIRONMENT = "environment"
"""``evaluator.verifier=environment``: the environment's own scoring (the default with one)."""


@dataclass(frozen=True)
class VerifierSpec:
    """Where the held-out accuracy comes from (see the module docstring).

    Attributes:
        source: the verifying source's metric name (``reward/<source>``), or None.
        verdict: how its value reads (``reward.VERDICTS``).
        episodes: an agent run: the verdict is each episode's reward, undiscounted.
        binary_only: chosen in auto without a declared verdict: accuracy only from an evaluation whose every
            value is 0 or 1.
        rewards_are_values: the reward has this one source at weight 1, so a row's reward is its value (for a
            workflow that sets no ``source_values``).
        what: what the held-out mean reward is, for the final line (``reward model``, ``gsm8k_reward_fn``...).
        note: said when the run reports no accuracy: why, and how to get it.
    """

    source: str | None
    what: str
    note: str
    verdict: str = "binary"
    episodes: bool = False
    binary_only: bool = False
    rewards_are_values: bool = False

    @property
    def active(self) -> bool:
        """Whether any evaluation of the run can report accuracy."""
        return self.source is not None or self.episodes


def bind_verifier(cfg, reward: RewardSpec | None, problems: list[str], environment=None) -> VerifierSpec | None:
    """The verifier of ``cfg`` (a ``TrainerConfig``) with its bound ``reward`` (and ``environment``, the bound
    ``EnvironmentSpec`` or None); problems are appended."""
    if reward is None:
        return None
    wanted = cfg.evaluator.verifier
    what = _what(reward)
    if environment is not None and environment.multi_turn:
        note = (f"no verifier: the held-out episode rewards of {environment.label} were not all 0 or 1 (before "
                "rollout.turn_discount)" if wanted is None else f"no accuracy: evaluator.verifier={NONE}")
        if wanted not in (None, NONE, ENVIRONMENT):
            problems.append(f"evaluator.verifier: got {wanted!r}; the episodes of {environment.label} are scored by "
                            f"the environment, so there is nothing else to name: leave it null or set {NONE}.")
            return None
        return VerifierSpec(None, f"{environment.label} episodes", note, episodes=wanted != NONE, binary_only=True)
    if cfg.rollout.agent is not None:
        if wanted not in (None, NONE):
            problems.append(f"evaluator.verifier: got {wanted!r}; an agent run (rollout.agent) is scored by the "
                            "agent's episode reward, not by a reward.fn function, so there is nothing to name: leave "
                            f"it null (accuracy when every held-out episode scores 0 or 1) or set {NONE}.")
            return None
        note = ("no verifier: the agent's held-out episode rewards were not all 0 or 1 (before rollout.turn_discount)"
                if wanted is None else f"no accuracy: evaluator.verifier={NONE}")
        return VerifierSpec(None, "agent episodes", note, episodes=wanted is None, binary_only=True)
    if wanted == NONE:
        return VerifierSpec(None, what, f"no accuracy: evaluator.verifier={NONE}")
    names = unique_names(reward.names)
    single = len(names) == 1 and reward.weights in (None, (1.0,))
    env = reward.environment
    if env is not None and wanted in (None, ENVIRONMENT):  # the environment's own scoring is the task's verdict
        if env.verdict is not None:
            return VerifierSpec(names[0], what, _unknown(names[0]), env.verdict, rewards_are_values=single)
        return VerifierSpec(names[0], what, f"no verifier: {env.label} gave held-out scores other than 0 and 1 "
                            "(its mean is reported)", binary_only=True, rewards_are_values=single)
    if wanted is not None:
        return _named(wanted, reward, names[1:] if env is not None else names, single, what, problems)
    declared = [(i, f) for i, f in enumerate(reward.functions) if verdict_of(f.fn)]
    if len(declared) > 1:
        if cfg.valid_dataset is not None:
            problems.append(f"evaluator.verifier: reward.fn has {len(declared)} verifiers "
                            f"({', '.join(f.path for _, f in declared)}); set evaluator.verifier to the one whose "
                            f"verdict is the task's accuracy (or {NONE}).")
        return None
    if declared:
        i, f = declared[0]
        return VerifierSpec(names[i], what, _unknown(names[i]), verdict_of(f.fn), rewards_are_values=single)
    if len(names) == 1 and reward.functions:
        f = reward.functions[0]
        return VerifierSpec(names[0], what, f"no verifier: {f.path} gave values other than 0 and 1 on the held-out "
                            f"set; evaluator.verifier={f.path} reports accuracy (correct when positive)",
                            binary_only=True, rewards_are_values=single)
    return VerifierSpec(None, what, _why_none(reward))


def _named(wanted: str, reward: RewardSpec, names: list[str], single: bool, what: str,
           problems: list[str]) -> VerifierSpec | None:
    matches = [i for i, f in enumerate(reward.functions) if wanted in (f.path, f.name)]
    if len(matches) == 1:
        i = matches[0]
        return VerifierSpec(names[i], what, _unknown(names[i]), verdict_of(reward.functions[i].fn) or "binary",
                            rewards_are_values=single)
    paths = ", ".join(f.path for f in reward.functions) or "none"
    if matches:
        problems.append(f"evaluator.verifier: {wanted!r} names {len(matches)} functions of reward.fn; give the import "
                        "path of one of them.")
    elif wanted in ("reward_model", "remote", (reward.model or {}).get("path"), (reward.remote or {}).get("url")):
        problems.append(f"evaluator.verifier: got {wanted!r}, a reward model or scoring service; its score says "
                        "how good an answer is, not whether it is right, so it is never a verifier. Name a function "
                        f"of reward.fn ({paths}) or set {NONE}.")
    else:
        problems.append(f"evaluator.verifier: got {wanted!r}, which is none of reward.fn's functions ({paths}); give "
                        f"one of them by import path or name, {NONE} (no accuracy), or null (auto).")
    return None


def _what(reward: RewardSpec) -> str:
    """What the reward is, as the final line names it: a source's name, or the mix of them."""
    parts = ([reward.environment_label] if reward.environment is not None else []) + [
        f.name for f in reward.functions] + (["reward model"] if reward.model else []) + (
        ["scoring service"] if reward.remote else [])
    return parts[0] if len(parts) == 1 else "weighted sum of " + ", ".join(parts)


def _why_none(reward: RewardSpec) -> str:
    if reward.functions:
        paths = ", ".join(f.path for f in reward.functions)
        return (f"no verifier among the reward sources; evaluator.verifier=<one of {paths}> reports accuracy from that "
                "function's own values")
    kind = "a reward model" if reward.model and not reward.remote else "a scoring service" if not reward.model else \
        "a reward model or a scoring service"
    return (f"no verifier: {kind} scores how good an answer is, not whether it is right; add a checking function "
            "to reward.fn and name it in evaluator.verifier to report accuracy")


def _unknown(name: str) -> str:
    return (f"no verifier values: the workflow sets no TrajectoryGroup.source_values, so {name}'s own verdicts are "
            "unknown in a weighted sum")
