"""Rollout: prompts in, trajectory groups out.

``engines/`` sample token ids, ``workflows/`` turn a prompt into a group with an engine, ``agents/`` run
user code that talks to the policy through an OpenAI-compatible client or endpoint. At this level: the
types every part shares (``types.py``), a group's rows built from sampled segments (``rows.py``), the
row limit (``limits.py``), dynamic filters (``filters.py``) and the staleness bound (``staleness.py``).
Engines import neither workflows nor agents; workflows do not import agents.
"""

from ..moved import install

install()  # old module paths (areal_trainer.rollout.workflows.multi_turn, ...) stay importable for a release
