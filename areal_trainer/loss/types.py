"""Inputs and result of the policy loss.

Tensor conventions (shared by every module of :mod:`areal_trainer.loss`): per-token tensors are
``[B, S]``, one right-padded row per sequence, and next-token aligned, so position ``t`` holds the
log-probability of token ``t + 1``. ``loss_mask[b, t]`` is true where that token is trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

import torch


class Reduction(StrEnum):
    """How a statistic of the loss combines over the micro-batches of a step (and, as a metric, over processes)."""

    MEAN = "mean"
    SUM = "sum"
    MAX = "max"
    MIN = "min"


@dataclass(frozen=True)
class Stat:
    """A statistic of one micro-batch, made with how it combines with the same key's values of the step's other
    micro-batches (``stats.py::reduce_stats``); the trainer carries the same reduction across processes.

    Attributes:
        value: 0-dim tensor (on the device; nothing here synchronises).
        reduction: a :class:`Reduction`.
        weight: for a mean, its 0-dim weight (the tokens it averages over: a token-weighted mean), or None for
            a plain mean (every micro-batch counts once).

    Made with :meth:`mean`, :meth:`sum`, :meth:`max` or :meth:`min`, e.g. ``Stat.mean(frac, weight=n_tokens)``.
    """

    value: torch.Tensor
    reduction: Reduction = Reduction.MEAN
    weight: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if isinstance(self.reduction, str) and self.reduction in {r.value for r in Reduction}:  # "max" -> MAX
            object.__setattr__(self, "reduction", Reduction(self.reduction))

    @classmethod
    def mean(cls, value: torch.Tensor, weight: torch.Tensor | None = None) -> Stat:
        """A mean: weighted by ``weight`` (e.g. its token count) over micro-batches, or plain without it."""
        return cls(value, Reduction.MEAN, weight)

    @classmethod
    def sum(cls, value: torch.Tensor) -> Stat:
        """A count or total: added up."""
        return cls(value, Reduction.SUM)

    @classmethod
    def max(cls, value: torch.Tensor) -> Stat:
        """An extreme: the largest (an empty micro-batch reports -inf, the identity)."""
        return cls(value, Reduction.MAX)

    @classmethod
    def min(cls, value: torch.Tensor) -> Stat:
        """An extreme: the smallest (an empty micro-batch reports +inf, the identity)."""
        return cls(value, Reduction.MIN)

    def detach(self) -> Stat:
        return Stat(self.value.detach(), self.reduction, None if self.weight is None else self.weight.detach())

    def item(self) -> float:
        """The value as a Python number (synchronises with the device: for tests and reports, not the step)."""
        return self.value.item()


Stats = dict[str, Stat]
"""A micro-batch's statistics keyed by slash-namespaced names, each with its reduction (see the package
docstring). What a user function returns may hold plain 0-dim tensors too (``stats.py::declared``)."""


def _cut(t: torch.Tensor | None, idx, width: int | None) -> torch.Tensor | None:
    """Rows ``idx`` of a ``[B, S]`` tensor, and its first ``width`` columns when given (None stays None)."""
    return None if t is None else t[idx][:, slice(None) if width is None else slice(0, width)]


@dataclass(frozen=True)
class TeacherLogprobs:
    """What the teachers said about the step's sampled tokens, ``[B, S]`` next-token aligned, 0 where not
    trained (built by ``train/models/teacher.py``; ``loss/distill.py`` uses it).

    Attributes:
        logp: ``sum_j w_j log pi_Tj`` of the teachers a row is routed to (one teacher: its log-probs).
        weight: ``sum_j w_j`` per token (one teacher: 1 on trained tokens); not normalised (MOPD).
        behavior: MOPD's immutable behaviour log-probs (the rollout's, rolled and masked,
            ``AdvantageResult.extras["mopd_behavior_logprobs"]``), or None for the single-teacher forms.
    """

    logp: torch.Tensor
    weight: torch.Tensor
    behavior: torch.Tensor | None = None

    def rows(self, idx, width: int | None = None) -> TeacherLogprobs:
        """The same log-probs restricted to rows ``idx`` (and to the first ``width`` columns, if given)."""
        return TeacherLogprobs(*(_cut(t, idx, width) for t in (self.logp, self.weight, self.behavior)))


@dataclass(frozen=True)
class PolicyLogprobs:
    """The log-probabilities of the two fixed policies of a step, and the versions that tie them to
    the trained one (built by ``train/policies.py``, the one place that decides them).

    Attributes:
        behavior: ``[B, S]`` log pi_behav, the "old" policy: the inference engine's logprobs, or,
            without the decoupled loss but with ``recompute_logprob``, their recomputation (AReaL's
            ``old_logp``). SAPO's ratio and the M2PO / rejection-sampling divergences are taken against it.
        proximal: ``[B, S]`` log pi_prox (the policy the PPO ratio is taken against), or None when it
            is to be approximated from versions (``prox_logp_method=loglinear``). Without the
            decoupled loss it is the behaviour policy itself.
        versions: ``[B, S]`` integer policy version of the behaviour token at each position (aligned
            like the logprobs), -1 at prompt and padding positions; or None.
        current_version: the version of pi_theta (an int or a 0-dim tensor), or None.
        teacher: the teachers' log-probs of on-policy distillation (:class:`TeacherLogprobs`), or None.
    """

    behavior: torch.Tensor
    proximal: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    current_version: int | torch.Tensor | None = None
    teacher: TeacherLogprobs | None = None

    @property
    def has_versions(self) -> bool:
        return self.versions is not None and self.current_version is not None

    def rows(self, idx, width: int | None = None) -> PolicyLogprobs:
        """The same policies restricted to rows ``idx`` (and to the first ``width`` columns, if given)."""
        return PolicyLogprobs(*(_cut(t, idx, width) for t in (self.behavior, self.proximal, self.versions)),
                              self.current_version, None if self.teacher is None else self.teacher.rows(idx, width))


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch of the actor update.

    Attributes:
        logprobs: ``[B, S]`` log pi_theta of the taken tokens; the only tensor the loss differentiates.
        policies: the behaviour and proximal policies (:class:`PolicyLogprobs`), ``[B, S]`` like ``logprobs``.
        advantages: ``[B, S]`` advantage per token.
        loss_mask: ``[B, S]`` bool or 0/1; true on tokens that enter the loss.
        entropy: ``[B, S]`` per-token entropy of pi_theta, detached, only reported in the stats.
    """

    logprobs: torch.Tensor
    policies: PolicyLogprobs
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    entropy: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # Shape checks read only Python metadata: no device synchronisation.
        shape = tuple(self.logprobs.shape)
        if len(shape) != 2:
            raise ValueError(f"logprobs must be [B, S] (right-padded rows); got shape {shape}.")
        pol = self.policies
        named = (("policies.behavior", pol.behavior), ("policies.proximal", pol.proximal),
                 ("policies.versions", pol.versions), ("advantages", self.advantages),
                 ("loss_mask", self.loss_mask), ("entropy", self.entropy))
        if pol.teacher is not None:
            t = pol.teacher
            named += (("policies.teacher.logp", t.logp), ("policies.teacher.weight", t.weight),
                      ("policies.teacher.behavior", t.behavior))
        for name, t in named:
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {shape} like logprobs.")


@dataclass(frozen=True)
class PolicyPlan:
    """Which log-probabilities a step computes (bound from AReaL's ``use_decoupled_loss``,
    ``recompute_logprob`` and ``prox_logp_method``; ``train/policies.py`` has the table).

    Attributes:
        recompute: run a no-grad forward of the current weights before the advantage.
        old: ``behavior`` (the engine's logprobs) or ``recomputed``: pi_old.
        proximal: ``old`` (pi_prox is pi_old), ``recomputed``, or ``loglinear`` (approximated in the loss).
    """

    recompute: bool
    old: str
    proximal: str


class PolicyLossResult(NamedTuple):
    """``loss``: 0-dim float32 tensor to backpropagate; ``stats``: detached 0-dim metrics."""

    loss: torch.Tensor
    stats: Stats
