"""A conversation scored by a verifiers task: the messages become a ``vf.Trace`` (its message graph, the
model's answers as sampled turns), the task's ``score`` runs its ``@vf.reward`` and ``@vf.metric`` functions
offline (those that need a sandbox runtime are skipped, as verifiers skips them without one), and the trace's
weighted reward with every function's own value is the :class:`~areal_trainer.environments.base.Score`."""

from __future__ import annotations

from .base import EnvironmentFailure, Score, describe, reward_value


def new_trace(task):
    """An empty ``vf.Trace`` of ``task``, as verifiers starts one for a rollout."""
    import verifiers.v1 as vf
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    return Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                 state=state_cls(type(task))(), agent=AgentInfo(config=vf.AgentConfig(), name="policy"))


async def score_conversation(task, messages: list[dict], sampled_from: int, *, stop: str | None = None) -> Score:
    """The task's own score of a conversation: its messages become the trace's message graph (the assistant
    messages from ``sampled_from`` on as sampled turns), then ``await task.score(trace)``."""
    from pydantic import TypeAdapter
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.types import Message

    parse = TypeAdapter(Message).validate_python
    try:
        trace = new_trace(task)
        for i, m in enumerate(messages):
            trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=parse(_vf_message(m)),
                                           sampled=i >= sampled_from and m["role"] == "assistant"))
        trace.stop_condition = stop
        trace.is_completed = trace.ok = True
        await task.score(trace)
    except Exception as e:  # noqa: BLE001 - the task's reward functions raised: the environment's failure
        raise EnvironmentFailure("score", f"{type(task).__name__}.score raised {describe(e)}") from e
    parts: dict[str, float] = {}
    total = 0.0
    for name, r in trace.rewards.items():
        if r is None:
            raise EnvironmentFailure("score", f"{type(task).__name__}: reward {name!r} was not computed")
        parts[name] = reward_value(r.score, f"reward function {name!r}")
        total += parts[name] * reward_value(r.weight, f"the weight of {name!r}")
    for name, value in trace.metrics.items():
        if value is not None:
            parts.setdefault(name, reward_value(value, f"metric {name!r}"))
    return Score(reward_value(total, "the weighted sum of the task's rewards"), parts)


def _vf_message(m: dict) -> dict:
    """A chat message in verifiers' form: an OpenAI tool call ``{id, function: {name, arguments}}`` becomes
    ``{id, name, arguments}``."""
    calls = m.get("tool_calls")
    if not calls:
        return {k: v for k, v in m.items() if k != "tool_calls"}
    flat = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            if "function" in c else c for c in calls]
    return {**m, "tool_calls": flat}
