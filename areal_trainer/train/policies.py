"""The policies of a step and where their log-probabilities come from, decided in one place.

* behaviour pi_behav: the policy that sampled the tokens; the inference engine recorded its log-probs
  (per token, with the policy version that sampled it);
* proximal pi_prox: the policy the PPO ratio and its trust region are anchored at (decoupled PPO,
  AReaL, arXiv:2505.24298);
* current pi_theta: the policy being trained; the update's forward gives its log-probs.

The rules, AReaL's (``actor.use_decoupled_loss``, ``actor.recompute_logprob``, ``actor.prox_logp_method``):

=========================================  ===================  ================================  ==========
configuration                              pi_old (KL reward,   pi_prox                           forward
                                           loss behaviour)                                        before update
=========================================  ===================  ================================  ==========
not decoupled, no recompute                engine logprobs      pi_old                            no
not decoupled, ``recompute_logprob``       recomputed           pi_old                            yes
decoupled, ``recompute`` / ``metrics``     engine logprobs      recomputed                        yes
decoupled, ``loglinear``                   engine logprobs      interpolated from versions        no
                                                                (in the loss)
=========================================  ===================  ================================  ==========

"Recomputed" is a no-grad forward of the current weights (version ``v``) over the batch. The
advantage receives pi_old (:attr:`AdvantageInputs.old_logprobs`); the loss receives one
:class:`~areal_trainer.loss.PolicyLogprobs` with behaviour (the same pi_old, masked by the loss mask the
advantage returned), proximal and versions. A full advantage replacement may return its own
``extras["prox_logp"]``, which then is the proximal policy.

The same module reports how far apart the policies are: the train/inference mismatch (the
recomputed current policy against the engine's logprobs, which differ by precision and, when
asynchronous, by staleness) and the staleness distribution of the trained tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..advantage import AdvantageResult
from ..advantage.align import shift_left
from ..loss import PolicyLogprobs, PolicyPlan, TeacherLogprobs
from ..metrics import Max, Mean, Metric


@dataclass(frozen=True)
class StepLogprobs:
    """A batch's ``[B, S]`` next-token-aligned log-probabilities before the advantage (unmasked).

    Attributes:
        behavior: the engine's logprobs of the sampled tokens.
        recomputed: the current weights' logprobs (no grad), or None when the plan needs none.
        versions: the behaviour policy version of each predicted token, -1 where nothing was sampled.
        old: pi_old, ``behavior`` or ``recomputed`` as the plan says.
    """

    behavior: torch.Tensor
    recomputed: torch.Tensor | None
    versions: torch.Tensor
    old: torch.Tensor


def aligned_versions(versions: torch.Tensor) -> torch.Tensor:
    """Roll token-aligned policy versions to next-token alignment (last column -1)."""
    v = torch.roll(versions, -1, dims=1)
    v[:, -1] = -1
    return v


def prepare(plan: PolicyPlan, logprobs: torch.Tensor, versions: torch.Tensor,
            forward: Callable[[], torch.Tensor]) -> StepLogprobs:
    """The step's log-probabilities from the rollout's token-aligned ``logprobs`` and ``versions``;
    ``forward()`` (the current weights, ``[B, S]`` aligned) runs only when the plan recomputes."""
    behavior = shift_left(logprobs, 0.0, torch.float32)
    recomputed = forward() if plan.recompute else None
    old = recomputed if plan.old == "recomputed" else behavior
    return StepLogprobs(behavior, recomputed, aligned_versions(versions), old)


def for_loss(plan: PolicyPlan, step: StepLogprobs, adv: AdvantageResult, version: int,
             teacher: TeacherLogprobs | None = None) -> PolicyLogprobs:
    """The loss's policies: pi_old masked by the advantage's loss mask, pi_prox by the plan (or the
    advantage's own ``extras["prox_logp"]``), versions against the current ``version``; with ``teacher``
    (on-policy distillation) the teachers' log-probs, with MOPD's behaviour log-probs from the advantage's
    ``extras["mopd_behavior_logprobs"]``."""
    old = step.old.float() * adv.loss_mask
    extras = adv.extras or {}
    proximal = extras.get("prox_logp")
    if proximal is None:
        proximal = {"old": old, "recomputed": step.recomputed, "loglinear": None}[plan.proximal]
    if teacher is not None and "mopd_behavior_logprobs" in extras:
        teacher = dataclasses.replace(teacher, behavior=extras["mopd_behavior_logprobs"].float())
    return PolicyLogprobs(behavior=old, proximal=proximal, versions=step.versions, current_version=version,
                          teacher=teacher)


def policy_metrics(step: StepLogprobs, mask: torch.Tensor, version: int, max_staleness: int) -> dict[str, Metric]:
    """Per-step distances between the policies over the trained tokens (``mask``, aligned ``[B, S]``).

    * ``staleness/frac_<d>`` for ``d = 0 .. max_staleness``: the share of trained tokens sampled ``d``
      versions before the current one (the mean and maximum are the loss's ``actor/staleness``);
    * with a recomputed current policy, the train/inference mismatch of the engine's logprobs:
      ``mismatch/abs_logp_diff`` (mean and ``/max``) ``|log pi_theta - log pi_behav|``, and the
      behaviour KL ``KL(pi_behav || pi_theta)`` estimated from the sampled tokens as ``mismatch/kl_k1``
      (``E[log pi_behav - log pi_theta]``) and ``mismatch/kl_k3`` (``E[r - 1 - log r]``,
      ``r = pi_theta / pi_behav``; never negative).
    """
    m = mask.bool() & (step.versions >= 0)
    n = m.sum()
    out: dict[str, Metric] = {}
    if int(n) == 0:
        return out
    w = float(n)  # every value is a mean over the trained tokens: weighted by them across processes
    lag = (version - step.versions)[m].clamp_min(0).long()
    counts = torch.bincount(lag, minlength=max_staleness + 1).float() / n
    for d in range(max_staleness + 1):
        out[f"staleness/frac_{d}"] = Mean(float(counts[d]), w)
    if step.recomputed is not None:
        diff = (step.recomputed.float() - step.behavior)[m]
        out["mismatch/abs_logp_diff"] = Mean(float(diff.abs().mean()), w)
        out["mismatch/abs_logp_diff/max"] = Max(float(diff.abs().max()))
        out["mismatch/kl_k1"] = Mean(float((-diff).mean()), w)
        out["mismatch/kl_k3"] = Mean(float((diff.exp() - 1 - diff).mean()), w)
    return out
