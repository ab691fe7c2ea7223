"""Run health: warnings, once each, when a step's metrics show that a run is drifting or hitting a limit.

A run can go wrong while every step succeeds: a lenient reward pays for malformed tool calls and the
policy learns to write them, answers grow until the token budget cuts them, the policy's entropy
collapses. :class:`HealthMonitor` reads each step's metrics (``metrics.jsonl``'s record) and warns
once per signal, with the numbers and what to look at:

* a **drift**: a rate rises well above its level at the start of the run (the first ``window`` steps
  that have it): at least ``RISE_FACTOR`` times that level and ``RISE_POINTS`` higher, over the last
  ``window`` steps. Rates: tool calls the parser could not read, answers cut at the token budget, and
  agent calls whose prompt did not extend their row (``rollout.agent_export=concat``);
* a **collapse**: the policy's entropy falls below ``COLLAPSE_FRACTION`` of its level at the start;
* a **limit**: most answers of a step (more than ``LIMIT_FRACTION``) stop at ``gconfig.max_new_tokens``,
  from the first step on: tool calls and final answers are then cut.

Rates are ratios of sums over the steps (numerator and denominator counted separately), so a step
with few calls does not swing them. The monitor has no state beyond the records it was shown and is
fed the same records on resume, so a resumed run warns as the uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW = 5
"""Steps in the start level and in the current level of a rate."""
RISE_FACTOR = 2.0
RISE_POINTS = 0.15
COLLAPSE_FRACTION = 0.2
LIMIT_FRACTION = 0.5

Counts = Callable[[dict], tuple[float, float] | None]
"""A step's (numerator, denominator) of a rate, or None when the step does not have it."""


def _ratio(num: str, *den: str) -> Counts:
    def counts(m: dict) -> tuple[float, float] | None:
        if num not in m or not all(k in m for k in den):
            return None
        d = sum(float(m[k]) for k in den)
        return (float(m[num]), d) if d > 0 else None
    return counts


def _truncated(m: dict) -> tuple[float, float] | None:
    """Answers cut at the token budget: an agent's calls, else the rows trained on."""
    if "agent/truncated" in m and m.get("agent/calls"):
        return float(m["agent/truncated"]), float(m["agent/calls"])
    if "rollout/truncated_frac" in m and m.get("rollout/rows"):
        rows = float(m["rollout/rows"])
        return float(m["rollout/truncated_frac"]) * rows, rows
    return None


def _mean(key: str) -> Counts:
    return lambda m: (float(m[key]), 1.0) if key in m else None


@dataclass(frozen=True)
class Signal:
    name: str
    counts: Counts
    what: str
    """What the rate is, as a sentence's subject: "tool calls the parser could not read"."""
    advice: str


TOOL_PARSE = Signal(
    "tool_parse_failures", _ratio("agent/tool_parse_failures", "agent/tool_calls", "agent/tool_parse_failures"),
    "tool calls the parser could not read (agent/tool_parse_failures)",
    "The policy may be learning malformed calls that its reward still pays for (a lenient reward, e.g. one "
    "that reads the last number of the reply, pays a broken call whose last number is the answer: "
    "docs/agents.md, 'Reward hacking'). Look at the completions in samples.jsonl and make the reward "
    "require a well-formed call or a final answer.")
TRUNCATION = Signal(
    "truncated", _truncated, "answers cut at gconfig.max_new_tokens (agent/truncated, rollout/truncated_frac)",
    "Answers are growing until the token budget cuts them: look at the completions in samples.jsonl (a "
    "reward for length, repetition that does not stop); raise gconfig.max_new_tokens if they need the room.")
CONCAT = Signal(
    "concat_fallbacks", _ratio("agent/concat_fallbacks", "agent/calls"),
    "agent calls whose prompt did not extend their row (agent/concat_fallbacks)",
    "The agent's conversation no longer re-renders to the sampled tokens (rollout.agent_export=concat): "
    "the policy writes text the chat template renders differently, or the agent edits its messages. "
    "Look at samples.jsonl; such calls are trained as rows of their own. rollout.chat_template_type=concat "
    "continues the sampled ids instead of re-rendering them (agent/chat_template_fallbacks counts the calls "
    "that edit their history).")
DRIFTS = (TOOL_PARSE, TRUNCATION, CONCAT)
ENTROPY = Signal("entropy", _mean("actor/entropy"), "the policy's entropy (actor/entropy)",
                 "The policy has become nearly deterministic and explores little: check the learning rate, "
                 "the clipping (actor.eps_clip_higher) and whether the reward can be gamed.")


@dataclass
class _Series:
    start: list[tuple[float, float]] = field(default_factory=list)
    start_steps: list[int] = field(default_factory=list)
    recent: list[tuple[int, float, float]] = field(default_factory=list)

    def add(self, step: int, num: float, den: float, window: int) -> None:
        if len(self.start) < window:
            self.start.append((num, den))
            self.start_steps.append(step)
            return
        self.recent = [*self.recent, (step, num, den)][-window:]

    @staticmethod
    def level(points) -> float:
        den = sum(p[-1] for p in points)
        return sum(p[-2] for p in points) / den if den else 0.0


def _steps(steps: list[int]) -> str:
    return f"step {steps[0]}" if steps[0] == steps[-1] else f"steps {steps[0]}-{steps[-1]}"


class HealthMonitor:
    """Feed each step's metrics to :meth:`observe`; it returns the warnings to show (each at most once).

    Args:
        max_new_tokens: ``gconfig.max_new_tokens``, named in the limit warning.
        window: steps in a rate's start level and in its current level.
    """

    def __init__(self, *, max_new_tokens: int | None = None, window: int = WINDOW):
        self.max_new_tokens, self.window = max_new_tokens, window
        self.series: dict[str, _Series] = {}
        self.warned: set[str] = set()

    def observe(self, step: int, metrics: dict) -> list[str]:
        out = []
        limit = self._limit(step, metrics)
        if limit:
            out.append(limit)
        for signal in (*DRIFTS, ENTROPY):
            counts = signal.counts(metrics)
            if counts is None:
                continue
            series = self.series.setdefault(signal.name, _Series())
            series.add(step, *counts, self.window)
            if signal.name in self.warned or len(series.recent) < self.window:
                continue
            message = self._collapse(signal, series) if signal is ENTROPY else self._drift(signal, series)
            if message:
                self.warned.add(signal.name)
                out.append(message)
        return out

    def _limit(self, step: int, m: dict) -> str | None:
        counts = _truncated(m)
        if "limit" in self.warned or counts is None or counts[0] <= LIMIT_FRACTION * counts[1]:
            return None
        self.warned.add("limit")
        budget = f"gconfig.max_new_tokens={self.max_new_tokens}" if self.max_new_tokens else "gconfig.max_new_tokens"
        what = "agent calls" if "agent/truncated" in m else "answers"
        return (f"warning: step {step}: {counts[0] / counts[1]:.0%} of the {what} ({counts[0]:.0f} of {counts[1]:.0f}) "
                f"stopped at {budget}: they are cut before they end (a tool call or a final answer cut short "
                "cannot be read). Raise gconfig.max_new_tokens, or look at the completions in samples.jsonl "
                "for answers that do not stop.")

    def _drift(self, signal: Signal, s: _Series) -> str | None:
        start, now = s.level(s.start), s.level(s.recent)
        if not (now >= RISE_FACTOR * start and now >= start + RISE_POINTS):
            return None
        steps = [p[0] for p in s.recent]
        return (f"warning: step {steps[-1]}: {signal.what} rose from {start:.0%} ({_steps(s.start_steps)}) to "
                f"{now:.0%} ({_steps(steps)}). {signal.advice}")

    def _collapse(self, signal: Signal, s: _Series) -> str | None:
        start, now = s.level(s.start), s.level(s.recent)
        if not (start > 0 and now < COLLAPSE_FRACTION * start):
            return None
        steps = [p[0] for p in s.recent]
        return (f"warning: step {steps[-1]}: {signal.what} fell from {start:.3g} ({_steps(s.start_steps)}) to "
                f"{now:.3g} ({_steps(steps)}), below {COLLAPSE_FRACTION:.0%} of its start. {signal.advice}")


def rates(metrics: dict) -> dict[str, float]:
    """The step's rates the progress bar shows for agent runs: tool-call parse failures and cut answers."""
    out = {}
    for key, counts in (("tool_fail", TOOL_PARSE.counts), ("cut", _truncated)):
        c = counts(metrics) if "agent/calls" in metrics else None
        if c is not None:
            out[key] = c[0] / c[1]
    return out
