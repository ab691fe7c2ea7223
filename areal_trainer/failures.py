"""One failure policy for the user code a run calls: reward functions, generated code in its box, agents' tools
and agent episodes.

User code may raise, return something unusable, or run past its time limit, and the run must survive all of
it. Every kind is held to the same rules, with its own numbers, bound once from the configuration
(``components/reward.py``) into a frozen :class:`FailurePolicy` that the reward service, the agent workflow
and the agents' tools all read:

1. **Contain.** A failed call scores the kind's ``error_value``, one past its time limit its ``timeout_value``
   (a tool has no score: the model reads the error text as the tool's result).
2. **End what overruns**, in the one way its kind allows (:data:`ENDINGS`): *killed*, a process (a reward
   worker, a code box: its process group is SIGKILLed and reaped); *cancelled*, a coroutine (an ``async``
   reward function in its worker, an async tool, an async agent; the others go on); *abandoned*, a thread
   (a plain ``def`` tool or agent) or an event loop the code blocks: a thread cannot be stopped, so it is
   left to run as a daemon and nobody waits for it any more.
3. **Count** it under the kind's one metric family (:func:`metric`): ``<family>errors``,
   ``<family>timeouts`` and, where a call can be abandoned, ``<family>abandoned``.
4. **Name** the first of each way of failing of each source once per run, in one format
   (:meth:`KindPolicy.notice`: kind, source, count of n, where it is counted and what it scored, the first
   example); later ones are only counted.
5. **Stop** when more than ``max_error_fraction`` of one batch's calls of a source failed (timeouts aside:
   they depend on the machine's load more than on the code), in one format (:meth:`KindPolicy.stop`:
   the source, the count of n, the key, how they failed, an example, what to change).

This module is the bottom layer: it imports nothing of the package but ``errors``.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from .errors import UserError

KINDS = ("reward", "code", "tool", "agent")
"""The kinds of user code: a reward function, generated code in its box, an agent's tool, an agent episode."""
ENDINGS = ("killed", "cancelled", "abandoned")
"""How a call past its time limit ends: a process is killed, a coroutine cancelled, a thread abandoned."""
FAMILIES = {"reward": "reward/", "tool": "agent/tool_", "agent": "agent/"}
"""Each kind's metric family (the keys' common start). The code box has none: it runs inside a reward call,
and what its code does (fail, overrun, be killed) is that call's value, the share of the tests it passed."""
REWARD_TIMEOUT, CODE_TIMEOUT = 30.0, 5.0
"""The defaults of ``reward.timeout`` and of ``unit_tests``' ``timeout`` (``reward.kwargs.timeout``)."""


def metric(kind: str, counter: str) -> str:
    """The key counting ``counter`` (``errors``, ``timeouts``, ``abandoned``, ...) of ``kind``: ``reward/errors``,
    ``agent/tool_timeouts``, ``agent/abandoned``."""
    if kind not in FAMILIES:
        raise ValueError(f"{kind!r} has no metric family; the families: {FAMILIES}")
    return FAMILIES[kind] + counter


@dataclass(frozen=True)
class KindPolicy:
    """The failure rules of one kind of user code (see the module docstring)."""

    kind: str
    """One of :data:`KINDS`."""
    subject: str
    """How messages name a source of this kind, before its name: ``reward source``, ``rollout.agent``."""
    units: str
    """What one call is, in the plural: ``samples``, ``episodes``, ``tool calls``."""
    batch: str
    """What the stop rule counts over: ``batch`` (one scoring of a source), ``rollout`` (one rollout call)."""
    timeout: float | None
    """Seconds one call may take (None: no limit)."""
    timeout_key: str
    """Where ``timeout`` is set."""
    ends: tuple[str, ...]
    """How a call past ``timeout`` ends (of :data:`ENDINGS`), by the form the code has."""
    error_value: float | None = None
    """The score of a failed call (None: not scored)."""
    error_key: str = ""
    timeout_value: float | None = None
    """The score of a call past ``timeout`` (None: not scored)."""
    timeout_value_key: str = ""
    max_error_fraction: float | None = None
    """More than this share of one batch's calls failing stops the run (None: failures never stop it)."""
    fraction_key: str = ""
    stop_on_no_result: bool = False
    """Also stop when no call of a batch gave a result at all, timeouts included (training on ``timeout_value``
    alone teaches nothing). Not for agents: an event loop the agent blocked is abandoned with every episode
    on it, and the next rollout starts on a new one."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r}; one of {KINDS}")
        if not set(self.ends) <= set(ENDINGS):
            raise ValueError(f"ends {self.ends!r}; each one of {ENDINGS}")
        if self.max_error_fraction is not None and not 0.0 <= self.max_error_fraction <= 1.0:
            raise ValueError(f"max_error_fraction must be in [0, 1], got {self.max_error_fraction!r}")

    @property
    def counters(self) -> tuple[str, ...]:
        """The counters of the kind's family: errors and timeouts, and abandoned where a call can be."""
        return ("errors", "timeouts") + (("abandoned",) if "abandoned" in self.ends else ())

    def metric(self, counter: str) -> str:
        """:func:`metric` of this kind."""
        return metric(self.kind, counter)

    def too_many(self, failed: int, total: int) -> bool:
        """The stop rule: more than ``max_error_fraction`` of ``total`` calls failed (exactly that share goes on)."""
        return self.max_error_fraction is not None and total > 0 and failed > self.max_error_fraction * total

    def scored(self, counter: str) -> str:
        """What a call counted in ``counter`` became."""
        if counter == "abandoned":
            return "a thread cannot be stopped: it is left to run, and no longer waited for"
        if counter == "timeouts":
            value, key, how = self.timeout_value, self.timeout_value_key, self._ended()
        else:
            value, key, how = self.error_value, self.error_key, ""
        if value is None:
            return how + "the model reads the error text as the result"
        return f"{how}scored {key + '=' if key else ''}{value:g}"

    def _ended(self) -> str:
        return f"ended after {self.limit} ({' or '.join(self.ends)}); "

    @property
    def limit(self) -> str:
        """The time limit as messages name it: ``reward.timeout=30 s``, or its key alone where the calls carry
        their own (None)."""
        return self.timeout_key if self.timeout is None else f"{self.timeout_key}={self.timeout:g} s"

    def notice(self, source: str, *, count: int, total: int, how: str, counter: str, example: str) -> str:
        """The one wording that names a failure: ``<subject> <source>: <count> of <total> <units> of this <batch>
        <how> (counted in <metric>; <what they scored>; the run stops above <key>=<x>); the first: <example>``."""
        stops = (f"; the run stops above {self.fraction_key}={self.max_error_fraction:g}"
                 if counter not in ("timeouts", "abandoned") and self.max_error_fraction is not None else "")
        counted = self.metric(counter) if self.kind in FAMILIES else "nothing"
        return (f"{self.subject} {source}: {count} of {total} {self.units} of this {self.batch} {how} (counted in "
                f"{counted}; {self.scored(counter)}{stops}); the first:{_gap(example)}{example}")

    def stop(self, source: str, *, failed: int, total: int, ways: str, example: str, change: str) -> UserError:
        """The one wording of the stop rule, as the error to raise: ``<subject> <source>: <failed> of <total>
        <units> of one <batch> failed (more than <key>=<x>; with no share: every one of them): <ways>. Example:
        <example>. <change>``."""
        why = ("every one of them" if self.max_error_fraction is None
               else f"more than {self.fraction_key}={self.max_error_fraction:g}")
        return UserError(f"{self.subject} {source}: {failed} of {total} {self.units} of one {self.batch} failed "
                         f"({why}): {ways}. Example:"
                         f"{_gap(example)}{example}{_gap(example, '. ')}{change}")

    def check(self, source: str, *, failed: int, total: int, ways: str, example: str, change: str) -> None:
        """Raise :meth:`stop`'s error when :meth:`too_many` says so."""
        if self.too_many(failed, total):
            raise self.stop(source, failed=failed, total=total, ways=ways, example=example, change=change)

    def check_some_result(self, source: str, *, total: int, timeouts: int, failed: int, change: str) -> None:
        """With ``stop_on_no_result``: stop when none of a batch's ``total`` calls gave a result and some timed out."""
        if self.stop_on_no_result and total and timeouts and timeouts + failed == total:
            raise UserError(f"{self.subject} {source}: {total} of {total} {self.units} of one {self.batch} gave no "
                            f"result: {timeouts} ran past {self.limit} and {failed} failed. "
                            f"Training on {self.timeout_value_key} alone teaches nothing: {change}")


def _gap(example: str, same_line: str = " ") -> str:
    """A multi-line example (a traceback) starts and ends on lines of its own."""
    return "\n" if "\n" in example else same_line


@dataclass(frozen=True)
class FailurePolicy:
    """The failure rules of every kind of user code, bound once per run (see the module docstring). Build it
    with :meth:`of`; ``FailurePolicy.of()`` has the configuration's defaults."""

    reward: KindPolicy
    code: KindPolicy
    tool: KindPolicy
    agent: KindPolicy

    @classmethod
    def of(cls, *, error_value: float = 0.0, timeout_value: float = 0.0, max_error_fraction: float = 0.5,
           reward_timeout: float | None = REWARD_TIMEOUT, reward_workers: int = 1,
           code_timeout: float | None = CODE_TIMEOUT, tool_timeout: float | None = None,
           agent_timeout: float | None = None) -> FailurePolicy:
        """The policy of these settings: ``reward.error_value``, ``reward.timeout_value``,
        ``reward.max_error_fraction``, ``reward.timeout``, ``reward.workers`` (0: reward functions run in the
        trainer, where nothing can be killed), the code box's ``timeout`` (``reward.kwargs.timeout``), a tool
        call's limit (``client.call_tool(timeout=...)``, none by default) and ``rollout.agent_timeout``."""
        fraction = dict(max_error_fraction=float(max_error_fraction), fraction_key="reward.max_error_fraction")
        error = dict(error_value=float(error_value), error_key="reward.error_value")
        return cls(
            reward=KindPolicy("reward", "reward source", "samples", "batch", reward_timeout, "reward.timeout",
                              ("killed", "cancelled") if reward_workers else ("cancelled",), **error,
                              timeout_value=float(timeout_value), timeout_value_key="reward.timeout_value",
                              **fraction, stop_on_no_result=True),
            # A program that fails or overruns is the policy's wrong answer, not a broken function: it fails its
            # tests (0 each) and never stops the run.
            code=KindPolicy("code", "unit_tests", "programs", "batch", code_timeout, "reward.kwargs.timeout",
                            ("killed",), error_value=0.0, timeout_value=0.0),
            tool=KindPolicy("tool", "the tools of rollout.agent", "tool calls", "rollout", tool_timeout,
                            "client.call_tool(timeout=...)", ("cancelled", "abandoned")),
            # An episode past its time scores reward.error_value, as one that raised.
            agent=KindPolicy("agent", "rollout.agent", "episodes", "rollout", agent_timeout, "rollout.agent_timeout",
                             ("cancelled", "abandoned"), **error, timeout_value=float(error_value),
                             timeout_value_key="reward.error_value", **fraction))

    def __getitem__(self, kind: str) -> KindPolicy:
        if kind not in KINDS:
            raise KeyError(f"{kind!r}; the kinds: {KINDS}")
        return getattr(self, kind)

    def with_timeout(self, kind: str, seconds: float | None) -> FailurePolicy:
        """This policy with ``kind``'s time limit set to ``seconds``."""
        return dataclasses.replace(self, **{kind: dataclasses.replace(self[kind], timeout=seconds)})

    def problems(self) -> list[str]:
        """Limits of nested kinds that cannot hold: a code box runs inside a reward call, so its limit must be
        shorter than the call's, or the call's worker is killed first and every slow program scores
        ``reward.timeout_value`` instead of failing its tests."""
        code, reward = self.code, self.reward
        if code.timeout is not None and reward.timeout is not None and "killed" in reward.ends \
                and code.timeout >= reward.timeout:
            return [f"{code.timeout_key}: got {code.timeout:g}; must be < {reward.timeout_key}={reward.timeout:g} "
                    f"seconds: {code.subject}'s box runs inside a reward call, whose worker would be killed first and "
                    f"score every slow program {reward.timeout_value_key}. Lower {code.timeout_key} or raise "
                    f"{reward.timeout_key}."]
        return []


DEFAULT = FailurePolicy.of()
"""The policy of the configuration's defaults."""


class Notices:
    """Which failures were named: each ``(kind, source, counter)`` once per run (the holder lives as long)."""

    def __init__(self) -> None:
        self._named: set[tuple[str, str, str]] = set()

    def name(self, policy: KindPolicy, source: str, *, count: int, total: int, how: str, counter: str,
             example: str) -> bool:
        """Print :meth:`KindPolicy.notice` as a warning when ``count`` calls failed this way and none of this
        source did so before; whether it was printed."""
        key = (policy.kind, source, counter)
        if not count or key in self._named:
            return False
        self._named.add(key)
        text = policy.notice(source, count=count, total=total, how=how, counter=counter, example=example)
        print(f"warning: {text}", file=sys.stderr, flush=True)
        return True
