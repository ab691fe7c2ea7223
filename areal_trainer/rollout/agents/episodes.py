"""What an agent's episodes become: their outcomes, their per-call rewards, their counters and a group's rows.

An episode ends ``ok`` (the agent returned), ``error`` (it raised) or ``timeout`` (past
``rollout.agent_timeout``: cancelled, or abandoned when its code cannot be stopped). :class:`EpisodeRows` is
bound once per run with the run's failure policy (``areal_trainer/failures.py``, its ``agent`` and ``tool``
kinds) and the export settings, and turns a prompt's outcomes into its :class:`TrajectoryGroup`: an episode
that did not return a usable result scores ``reward.error_value`` on its last call; more than
``reward.max_error_fraction`` of such episodes in a rollout call stops the run with the agent's name and
one example; the first of each way of failing (and the first tool call that ran out of time) is named once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...dtypes import fits_float32
from ...errors import UserError
from ...failures import DEFAULT, FailurePolicy, Notices, metric
from ...metrics import Mean, Sum
from ...model.vision import prompt_inputs
from ..rows import Rows, Segment
from ..types import TrajectoryGroup
from .session import EpisodeSession
from .trajectory import EXPORTS, discounted_rewards, export_rows

STATUSES = ("ok", "error", "timeout")


@dataclass
class Outcome:
    """One episode's end: its session (the calls it made), how it ended, what the agent returned or why not."""

    session: EpisodeSession
    status: str  # one of STATUSES
    result: Any = None
    error: str = ""
    abandoned: bool = False
    """A timeout whose code could not be stopped (a plain ``def`` agent's thread): left running."""


class EpisodeRows:
    """Outcomes -> rows, bound once (see the module docstring).

    Args:
        tokenizer: renders the prompt of a group none of whose episodes made a call.
        agent: the agent's import path, for messages.
        failures: the run's failure policy: its ``agent`` kind gives the reward of an episode's last call when
            the episode has no usable result, and the share of a rollout call's episodes that may fail before
            the run stops.
        turn_discount: the per-call discount of later rewards, in (0, 1].
        export: ``individual`` or ``concat`` (``trajectory.py``).
    """

    def __init__(self, *, tokenizer, agent: str, failures: FailurePolicy = DEFAULT, turn_discount: float = 1.0,
                 export: str = "individual"):
        if export not in EXPORTS:
            raise UserError(f"rollout.agent_export: got {export!r}; must be one of {', '.join(EXPORTS)}.")
        self.tokenizer, self.agent, self.export = tokenizer, agent, export
        self.failures = failures
        self.error_value = failures.agent.error_value
        self.turn_discount = float(turn_discount)
        self._notices = Notices()
        """The ways of failing already named (each once per run)."""

    def check(self, outcomes: list[Outcome], bad: list[str]) -> None:
        """The failure policy on one rollout call's episodes (``bad``: what was wrong with each unusable result):
        stop the run when more than ``reward.max_error_fraction`` of them failed (raised or gave an unusable
        result; timeouts aside); else name the first of each way of failing once per run."""
        policy, total = self.failures.agent, len(outcomes)
        raised = [o.error for o in outcomes if o.status == "error"]
        ways = ", ".join(f"{len(found)} {how}" for found, how in ((raised, "raised"), (bad, "had an unusable result"))
                         if found)
        policy.check(self.agent, failed=len(raised) + len(bad), total=total, ways=ways,
                     example=(raised + bad)[0] if raised or bad else "",
                     change=f"Fix the agent, or raise {policy.fraction_key}.")
        timeouts = [o for o in outcomes if o.status == "timeout"]
        abandoned = [o for o in timeouts if o.abandoned]
        for counter, how, found in (("errors", "raised", raised), ("bad_results", "had an unusable result", bad),
                                    ("timeouts", "ran out of time", [o.error for o in timeouts]),
                                    ("abandoned", "could not be stopped", [o.error for o in abandoned])):
            self._notices.name(policy, self.agent, count=len(found), total=total, how=how, counter=counter,
                               example=found[0] if found else "")
        sessions = [o.session for o in outcomes]
        runs = sum(s.counters.tool_runs for s in sessions)
        for counter, how in (("timeouts", "ran out of time"), ("abandoned", "could not be stopped")):
            found = [d for s in sessions for ended, d in s.tool_overruns.items() if counter == "timeouts"
                     or ended == counter]
            count = sum(s.counters.tool_timeouts if counter == "timeouts" else s.counters.tool_abandoned
                        for s in sessions)
            self._notices.name(self.failures.tool, self.agent, count=count, total=runs, how=how, counter=counter,
                               example=found[0] if found else "")

    def rewards(self, o: Outcome) -> list[float | None] | str:
        """Per-call rewards of an episode (None: not set), or why its result is unusable."""
        records = o.session.records
        rewards = [r.reward for r in records]
        if o.status != "ok":
            rewards[-1] = self.error_value
            return rewards
        result = o.result
        if isinstance(result, dict):
            ids = {r.completion_id for r in records}
            unknown = [k for k in result if k not in ids]
            if unknown:
                return f"returned rewards for unknown completion ids {unknown[:3]}"
            for r in records:
                if r.completion_id in result:
                    r.reward = number(result[r.completion_id])
            bad = [v for v in result.values() if v is not None and number(v) is None]
            if bad:
                return f"returned the reward {bad[0]!r:.80}; a reward is a finite number within float32"
            rewards = [r.reward for r in records]
        else:
            value = number(result)
            if value is None:
                return (f"returned {result!r:.80}; an agent returns a float reward (finite, within float32) or "
                        "{completion_id: reward}")
            rewards[-1] = value
        total = discounted_rewards(rewards, self.turn_discount)
        if not all(fits_float32(x) for x in total):
            return "gave rewards whose discounted sum leaves float32"
        return rewards

    def groups(self, samples: list[dict], outcomes: list[Outcome]) -> list[TrajectoryGroup]:
        """The groups of one rollout call, ``len(outcomes) // len(samples)`` episodes per prompt. An episode whose
        result is unusable (not a number, or beyond float32) is trained with ``error_value`` and counted
        (``agent/bad_results``), the first of the run named once; the run stops when more than
        ``max_error_fraction`` of the call's episodes (not of one group: a group may have one episode) had one."""
        g = len(outcomes) // max(len(samples), 1)
        built, bad = [], []
        for i, sample in enumerate(samples):
            group, errors = self.group(sample, outcomes[i * g:(i + 1) * g])
            built.append(group)
            bad += errors
        self.check(outcomes, bad)
        return built

    def lost(self, samples: list[dict], n: int, *, where: str = "", seconds: float = 0.0) -> list[TrajectoryGroup]:
        """The groups of a rollout call whose ``n`` episodes per prompt were abandoned with their event loop, which
        the agent blocked ``seconds`` at ``where``: one untrained row each (as a group that made no call), every
        episode counted as a timeout and as abandoned; the first such rollout is named once."""
        out = []
        for sample in samples:
            group, _ = self.group(sample, [])
            group.stats.update({"agent/episodes": Sum(float(n)), "agent/timeouts": Sum(float(n)),
                                metric("agent", "abandoned"): Sum(float(n))})
            out.append(group)
        policy, total = self.failures.agent, len(samples) * n
        self._notices.name(policy, self.agent, count=total, total=total, counter="abandoned",
                           how=f"were abandoned with the episodes' event loop, still blocked {seconds:.0f} s into the "
                               f"rollout, past {policy.timeout_key}={policy.timeout:g} s: the rollout's {total} "
                               "episodes end as timeouts (untrained) and the next rollout starts on a new loop",
                           example=f"the agent blocks it at:\n{where}")
        return out

    def group(self, sample: dict, outcomes: list[Outcome]) -> tuple[TrajectoryGroup, list[str]]:
        """One prompt's group: its episodes' rows in episode order, with each episode's row count and reward;
        and what was wrong with each unusable result."""
        rows, counts, episode_rewards, errors, stats = [], [], [], [], counters(outcomes)
        for o in outcomes:
            if not o.session.records:
                continue
            rewards = self.rewards(o)
            if isinstance(rewards, str):
                errors.append(rewards)
                rewards = [None] * (len(o.session.records) - 1) + [self.error_value]
            returns = discounted_rewards(rewards, self.turn_discount)
            exported, fallbacks = export_rows(o.session.records, returns, self.export)
            stats["agent/concat_fallbacks"] = Sum(stats["agent/concat_fallbacks"].value + fallbacks)
            rows += exported
            counts.append(len(exported))
            episode_rewards.append(returns[0])
        stats["agent/bad_results"] = Sum(float(len(errors)))
        stats["agent/errors"] = Sum(stats["agent/errors"].value + len(errors))
        if not rows:  # nothing was sampled: one untrained row keeps the prompt's place in the batch
            ids, vision = prompt_inputs(self.tokenizer, sample)  # an image prompt keeps its images
            empty = Rows.from_segments([[Segment(ids)]], rewards=[self.error_value], truncated=[False],
                                       num_turns=[0.0])
            stats["agent/empty_groups"] = Sum(1.0)
            return TrajectoryGroup(empty, stats=stats, vision=None if vision is None else (vision,)), errors
        built = Rows.from_segments([r.segments for r in rows], rewards=[r.reward for r in rows],
                                     truncated=[r.truncated for r in rows], num_turns=[r.calls for r in rows])
        stats["agent/empty_groups"] = Sum(0.0)
        stats["agent/episode_reward"] = Mean(sum(episode_rewards) / len(episode_rewards), len(episode_rewards))
        vision = tuple(r.vision for r in rows) if any(r.vision is not None for r in rows) else None
        return (TrajectoryGroup(built, stats=stats, episode_rows=tuple(counts), episode_rewards=tuple(episode_rewards),
                                vision=vision), errors)


def number(x: Any) -> float | None:
    """A reward as a float (a Python number or a one-element tensor/array) that stays finite as a float32;
    None for anything else (NaN, infinity, ``1e39``, text, ...)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "item"):
        return None
    try:
        value = float(x) if isinstance(x, (int, float)) else float(x.item())
    except Exception:  # noqa: BLE001 - not a number, or an int too large for a float
        return None
    return value if fits_float32(value) else None


def counters(outcomes: list[Outcome]) -> dict[str, Sum]:
    """The counters of a group's episodes (summed over groups and ranks)."""
    c = [o.session.counters for o in outcomes]
    return {
        "agent/episodes": Sum(float(len(outcomes))),
        "agent/errors": Sum(float(sum(o.status == "error" for o in outcomes))),
        "agent/timeouts": Sum(float(sum(o.status == "timeout" for o in outcomes))),
        metric("agent", "abandoned"): Sum(float(sum(o.abandoned for o in outcomes))),
        "agent/calls": Sum(float(sum(x.calls for x in c))),
        "agent/tool_calls": Sum(float(sum(x.tool_calls for x in c))),
        "agent/tool_errors": Sum(float(sum(x.tool_errors for x in c))),
        metric("tool", "timeouts"): Sum(float(sum(x.tool_timeouts for x in c))),
        metric("tool", "abandoned"): Sum(float(sum(x.tool_abandoned for x in c))),
        "agent/tool_parse_failures": Sum(float(sum(x.tool_parse_failures for x in c))),
        "agent/length_refusals": Sum(float(sum(x.length_refusals for x in c))),
        "agent/truncated": Sum(float(sum(x.truncated for x in c))),
        "agent/bad_requests": Sum(float(sum(x.bad_requests for x in c))),
        "agent/concat_fallbacks": Sum(0.0),
        "agent/chat_template_fallbacks": Sum(float(sum(x.chat_template_fallbacks for x in c))),
    }
