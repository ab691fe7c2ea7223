"""Training: the only orchestrator.

``models/`` (the policy, reference, critic and teachers, their updates), ``sources/`` (where a step's
groups come from: synchronous, lagged, concurrent), ``state/`` (checkpoints, manifests, resume). At
this level: the run's start-up (``run.py``), the step (``step.py``), the loop (``loop.py``), evaluation,
the warm start (``sft.py``), the preflight checks and the batch a step trains on.
"""

from ..moved import install

install()  # old module paths (areal_trainer.train.checkpoint, ...) stay importable for a release
