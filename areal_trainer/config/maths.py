"""The enumerations and value rules of the maths, as the config checks use them.

They are defined next to the code that implements them (``loss/``, ``advantage/``) and imported here
when a config is first checked, not when the schema is imported: that import pulls in torch, most of
the command line's start-up time (a run with a bad override pays it too: the rest of its config is
validated in the same round, see ``loader.override_problems``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace


@functools.cache
def maths() -> SimpleNamespace:
    from ..advantage import gae, normalize
    from ..loss import aggregate, kl, prox, ratio, rejection

    return SimpleNamespace(
        GAE_UNITS=gae.TIME_UNITS, NORM_LEVELS=normalize.NORM_LEVELS, LOSS_AGG_MODES=aggregate.LOSS_AGG_MODES,
        KL_ESTIMATORS=kl.KL_ESTIMATORS, PROX_LOGP_METHODS=prox.PROX_LOGP_METHODS, IS_LEVELS=ratio.IS_LEVELS,
        rejection_problems=rejection.rejection_problems)
