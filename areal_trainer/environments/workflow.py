"""The agent workflow of a multi-turn environment: ``rollout/agents/workflow.py``'s ``AgentWorkflow`` running
an :class:`~areal_trainer.environments.agent.EnvironmentAgent`, so episodes run as any agent's do (sampled
together, under sync, lagged and asynchronous sources, in groups, rows as ``rollout.agent_export`` says), plus
each group's ``env/*`` metrics from its episodes' records, and the environment's stopping rule: a rollout call
whose every episode failed in the environment stops the run, naming the environment and the first failure."""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from ..rollout.agents.spec import AgentSpec
from ..rollout.agents.workflow import AgentWorkflow
from ..rollout.types import TrajectoryGroup
from .agent import EnvironmentAgent, record_stats
from .base import KEY


class EnvironmentWorkflow(AgentWorkflow):
    """``AgentWorkflow`` over ``environment`` (an adapter with ``episode``); the other keyword arguments are
    ``AgentWorkflow``'s, but ``agent``."""

    def __init__(self, *, environment: Any, engine, tokenizer, reward, **kwargs: Any):
        self.env_agent = EnvironmentAgent(environment, error_value=getattr(reward, "error_value", 0.0))
        spec = AgentSpec(path=f"(environment {environment.label})", target=self.env_agent.run, is_class=False,
                         style="client", is_async=True, kwargs={})
        super().__init__(engine=engine, tokenizer=tokenizer, reward=reward, agent=spec, **kwargs)
        self.environment = environment

    def rollout(self, samples: list[dict], gconfig: Any) -> list[TrajectoryGroup]:
        groups = super().rollout(samples, gconfig)
        records = [self.env_agent.take(self.data(s).get(KEY)) for s in samples]
        for group, mine in zip(groups, records):
            group.stats.update(record_stats(mine))
        every = [r for mine in records for r in mine]
        failed = [r for r in every if r.failure is not None]
        if every and len(failed) == len(every):
            raise UserError(f"environment {self.environment.label}: every one of the {len(every)} episodes of a "
                            f"rollout failed in the environment; the first: {failed[0].failure}. Fix the environment "
                            "(or its environment.kwargs); a run whose every episode fails cannot learn.")
        return groups
