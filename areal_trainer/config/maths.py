"""The names of the maths that the config's checks accept, spelled without importing the maths.

The maths define them next to the code that implements them (``loss/``, ``advantage/``), in modules that
import torch. The schema's checks run before anything heavy is imported (the command line reports a bad
value before torch loads), so the names are written here once more; ``tests/config/test_light_checks.py``
fails when they differ from the maths' own. The maths' rules (rejection sampling's bounds, the loss's,
the advantage stages') are not copied: they run where they are defined, in the full check.
"""

from __future__ import annotations

GAE_UNITS = ("token", "turn")
"""``advantage/gae.py::TIME_UNITS``: what one GAE step is (``actor.gae_timestep_unit``)."""
NORM_LEVELS = ("batch", "group", None)
"""``advantage/normalize.py::NORM_LEVELS``: the levels of a normalisation's mean and std."""
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
"""``loss/aggregate.py::LOSS_AGG_MODES`` (``actor.loss_agg_mode``)."""
KL_ESTIMATORS = ("k1", "k2", "k3")
"""``loss/kl.py::KL_ESTIMATORS`` (``actor.kl_estimator``)."""
PROX_LOGP_METHODS = ("recompute", "loglinear", "metrics")
"""``loss/prox.py::PROX_LOGP_METHODS`` (``actor.prox_logp_method``)."""
IS_LEVELS = ("token", "sequence")
"""``loss/ratio.py::IS_LEVELS`` (``actor.importance_sampling_level``)."""


def rejection_problems(key: str, **settings) -> list[str]:
    """The rules of a ``rejection_sampling`` section: ``loss/rejection.py``'s, imported on first use (torch)."""
    from ..loss.rejection import rejection_problems as rules

    return rules(key, **settings)
