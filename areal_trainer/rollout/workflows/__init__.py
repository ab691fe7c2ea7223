"""Workflows written against an engine: ``single_turn.py`` (one verifiable answer per sample, the
default). A workflow meets :class:`~areal_trainer.rollout.types.Workflow`; agents are workflows too
(``rollout/agents/workflow.py``, and the multi-turn "try again" workflow, ``rollout/agents/multi_turn.py``,
an agent on the episode session) but workflows never import agents.
"""
