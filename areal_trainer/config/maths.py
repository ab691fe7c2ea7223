"""The enumerations and rules of the maths (and of the loss binding), as the config checks use them.

They are defined next to the code that implements them (``loss/``, ``advantage/``) and imported
here when a config is first checked, not when the schema is imported: that import pulls in torch,
most of the command line's start-up time (a run with a bad override pays it too: the rest of its config is
validated in the same round, see ``loader.override_problems``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace


@functools.cache
def maths() -> SimpleNamespace:
    from ..advantage import gae, normalize, process, stages
    from ..loss import aggregate, kl, prox, ratio, rejection
    from .loss import policy_loss_problems

    return SimpleNamespace(
        GAE_UNITS=gae.TIME_UNITS, NORM_LEVELS=normalize.NORM_LEVELS, OUTCOME_BUILTINS=stages.OUTCOME_BUILTINS,
        ESTIMATOR_BUILTINS=stages.ESTIMATOR_BUILTINS, PROCESS_BUILTINS=stages.PROCESS_BUILTINS,
        BASELINE_BUILTINS=stages.BASELINE_BUILTINS,
        process_stage_problems=process.process_stage_problems, LOSS_AGG_MODES=aggregate.LOSS_AGG_MODES,
        KL_ESTIMATORS=kl.KL_ESTIMATORS, PROX_LOGP_METHODS=prox.PROX_LOGP_METHODS, IS_LEVELS=ratio.IS_LEVELS,
        rejection_problems=rejection.rejection_problems, policy_loss_problems=policy_loss_problems)
