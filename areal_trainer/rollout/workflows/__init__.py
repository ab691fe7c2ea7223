"""Workflows written against an engine: ``single_turn.py`` (one verifiable answer per sample, the
default) and ``multi_turn.py`` (answer, feedback, another try). A workflow meets
:class:`~areal_trainer.rollout.types.Workflow`; agents are workflows too (``rollout/agents/workflow.py``)
but workflows never import agents.
"""
