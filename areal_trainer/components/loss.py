"""Binding the actor's policy-loss settings to the loss's stages, once, at start-up.

``bind_policy_loss(actor_cfg)`` reads AReaL's keys (``eps_clip``, ``rejection_sampling``, ...) and
``actor.loss`` and returns the callable the update uses:

* the surrogate is the one ``config/areal_keys.surrogate_choice`` picks from ``actor.loss.surrogate``,
  ``use_sapo_loss`` and ``use_cispo_loss``: a built-in name (``loss.surrogate.SURROGATES``) or an import
  path ``package.module.function`` of a ``fn(SurrogateInputs, **kwargs) -> SurrogateResult`` (its kwargs
  from ``actor.loss.surrogate.kwargs``). A built-in reads its settings from the ``actor`` keys named like
  its keyword arguments.
* ``actor.loss.compute.implementation``: ``default`` (the staged loss), or an import path of a whole
  ``fn(PolicyLossInputs, *, normalizer, **kwargs) -> PolicyLossResult``.

Every problem is reported as one ``ConfigError`` naming the keys; a user function's output is
checked at every call (shape, finiteness, a scalar loss and a dict of scalar stats, and that the loss
has a gradient) and a bad one stops the run with a ``PluginOutputError`` naming the function.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..config.areal_keys import surrogate_choice
from ..errors import ConfigError, PluginOutputError, one_of
from ..loss import (
    SURROGATES,
    BoundSurrogate,
    PolicyLoss,
    PolicyLossResult,
    PolicyPlan,
    Reduction,
    RejectionSettings,
    Stat,
    Surrogate,
    declared,
)
from ..loss.aggregate import aggregation_problems
from ..loss.m2po import m2po_problems
from ..plugins import PluginError, resolve


def _settings(fn: Callable, actor) -> dict[str, Any]:
    """The keyword-only arguments of a built-in surrogate, read from the ``actor`` keys of the same names."""
    names = [n for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY]
    return {n: getattr(actor, n) for n in names}


def policy_loss_problems(key: str, actor) -> list[str]:
    """The rules of the policy loss on an actor config (without importing user functions). The settings
    of every built-in surrogate are ``actor`` keys and are checked whichever surrogate is chosen."""
    p = m2po_problems(key, m2_threshold=actor.m2_threshold)
    # Surrogates may share a rule (clip and CISPO read the same clip range): each rule runs once.
    rules: dict = {}
    for spec in SURROGATES.values():
        if spec.problems is not None:
            rules.setdefault(spec.problems, spec.fn)
    for rule, fn in rules.items():
        p += rule(key, **_settings(fn, actor))
    p += aggregation_problems(key, loss_agg_mode=actor.loss_agg_mode, max_new_tokens=actor.max_new_tokens)
    stage, compute = actor.loss.surrogate, actor.loss.compute
    replaced = compute is not None and compute.implementation != "default"
    if replaced and stage is not None:
        p.append(f"{key}.loss.compute.implementation={compute.implementation!r} replaces the whole policy loss and "
                 f"cannot be combined with {key}.loss.surrogate; set it to null.")
    choice, conflicts = surrogate_choice(actor, key)
    p += conflicts
    name = choice.name
    if choice.is_path:
        return p
    if name not in SURROGATES:
        return p + one_of(f"{key}.loss.surrogate.implementation", name, ("auto", *SURROGATES),
                          "Or give an import path 'package.module.function'.")
    spec = SURROGATES[name]
    if stage is not None and stage.kwargs:
        settings = ", ".join(f"{key}.{n}" for n in _settings(spec.fn, actor)) or "no keys"
        p.append(f"{key}.loss.surrogate.kwargs: the built-in {name!r} reads its settings from {settings}; set those "
                 "instead (kwargs are for surrogates given by import path).")
    if actor.use_decoupled_loss and not spec.decoupled:
        what = f"{choice.key}: {name.upper()}" if choice.key.endswith("_loss") else f"{key}.loss.surrogate {name!r}"
        p.append(f"{what} is not compatible with use_decoupled_loss=true; set {key}.use_decoupled_loss=false.")
    if name == "cispo" and actor.importance_sampling_level != "token":
        p.append(f"{choice.key}: CISPO weights each token by its own ratio; it needs "
                 f"{key}.importance_sampling_level=token (got {actor.importance_sampling_level!r}).")
    return p


def bind_policy_loss(actor, key: str = "actor") -> Callable[..., PolicyLossResult]:
    """The policy loss ``actor`` selects, bound once; raises ``ConfigError`` listing every problem."""
    problems = policy_loss_problems(key, actor)
    compute = actor.loss.compute
    if compute is not None and compute.implementation != "default":
        fn = _resolve(compute.implementation, f"{key}.loss.compute.implementation", compute.kwargs, problems,
                      n_positional=1, extra={"normalizer": None})
        if problems:
            raise ConfigError(problems)
        return CheckedLoss(fn, dict(compute.kwargs), f"{key}.loss.compute.implementation ({compute.implementation})")
    choice, _ = surrogate_choice(actor, key)
    name = choice.name
    if choice.is_path:
        stage = actor.loss.surrogate
        fn = _resolve(name, f"{key}.loss.surrogate.implementation", stage.kwargs, problems, n_positional=1)
        surrogate = BoundSurrogate(name, Surrogate(_checked_surrogate(fn, f"{key}.loss.surrogate ({name})")),
                                   dict(stage.kwargs))
    elif name in SURROGATES:
        surrogate = BoundSurrogate(name, SURROGATES[name], _settings(SURROGATES[name].fn, actor))
    if problems:
        raise ConfigError(problems)
    return PolicyLoss(
        surrogate=surrogate, importance_sampling_level=actor.importance_sampling_level,
        use_decoupled_loss=bool(actor.use_decoupled_loss), rejection=_rejection(actor),
        m2_threshold=None if actor.m2_threshold is None else float(actor.m2_threshold),
        prox_logp_method=actor.prox_logp_method, loss_agg_mode=actor.loss_agg_mode,
        max_new_tokens=int(actor.max_new_tokens))


def policy_plan(actor) -> PolicyPlan:
    """Which log-probabilities a step computes (``train/policies.py`` has the table)."""
    if actor.use_decoupled_loss:
        if actor.prox_logp_method == "loglinear":
            return PolicyPlan(recompute=False, old="behavior", proximal="loglinear")
        return PolicyPlan(recompute=True, old="behavior", proximal="recomputed")
    if actor.recompute_logprob:
        return PolicyPlan(recompute=True, old="recomputed", proximal="old")
    return PolicyPlan(recompute=False, old="behavior", proximal="old")


def _rejection(actor) -> RejectionSettings | None:
    """Rejection sampling is bound only with the decoupled loss; ``action=clamp`` without ``lower``
    clamps from 0."""
    rs = actor.rejection_sampling
    if rs is None or not actor.use_decoupled_loss:
        return None
    lower = 0.0 if rs.action == "clamp" and rs.lower is None else rs.lower
    return RejectionSettings(level=rs.level, action=rs.action, metric=rs.metric, upper=float(rs.upper),
                             lower=None if lower is None else float(lower), agg=rs.agg)


def _resolve(path: str, key: str, kwargs, problems: list[str], *, n_positional: int, extra=None) -> Callable | None:
    try:
        return resolve(path, key, {**(extra or {}), **dict(kwargs or {})}, n_positional=n_positional)
    except PluginError as e:
        problems.append(str(e))
        return None


def _fail(label: str, what: str) -> None:
    raise PluginOutputError(f"{label}: {what}")


def _check_gradient(label: str, name: str, out: torch.Tensor, logprobs: torch.Tensor) -> None:
    """``out`` must reach the policy's log-probs through autograd whenever they carry a gradient (reads
    metadata only, no host sync). Without this, ``backward()`` fails later with torch's "element 0 of
    tensors does not require grad", which names no plugin; a leaf (``requires_grad`` set, no
    ``grad_fn``) would even train nothing, silently."""
    if torch.is_grad_enabled() and logprobs.requires_grad and out.grad_fn is None:
        _fail(label, f"the {name} has no gradient (requires_grad={out.requires_grad}, grad_fn=None), so training "
                     "would not change the policy. Compute it with torch operations from the inputs' logprobs "
                     "(or ratio); do not .detach() it, call .item() on it, or rebuild it with torch.tensor() (a zero "
                     "loss is (inputs.logprobs * 0).sum()).")


def _scalar(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 0


def _check_stats(label: str, stats: Any) -> None:
    """A dict of str -> 0-dim tensors (given the default reduction, ``loss/stats.py::declared``) or ``Stat``s
    made with theirs (``Stat.mean(x, weight=n)``, ``Stat.sum``, ``Stat.max``, ``Stat.min``)."""
    if not isinstance(stats, dict) or not all(isinstance(k, str) for k in stats):
        _fail(label, "stats must be a dict of str -> 0-dim tensors or loss.Stat values (use {} for none).")
    for key, v in stats.items():
        if isinstance(v, Stat):
            if not (_scalar(v.value) and isinstance(v.reduction, Reduction)
                    and (v.weight is None or v.reduction is Reduction.MEAN and _scalar(v.weight))):
                _fail(label, f"stats[{key!r}] is a Stat whose value (or weight) is not a 0-dim tensor, or whose weight "
                             "is not that of a mean; make it with Stat.mean(x, weight=n), Stat.sum(x), Stat.max(x) or "
                             "Stat.min(x) of 0-dim tensors.")
        elif not _scalar(v):
            _fail(label, f"stats[{key!r}] is a {type(v).__name__}; stats must be a dict of str -> 0-dim tensors or "
                         "loss.Stat values (use {} for none).")


def _checked_surrogate(fn: Callable, label: str) -> Callable:
    """``fn`` with its output checked at every call: ``(token_loss [B, S], stats)``, finite on the mask."""
    from ..loss import SurrogateResult

    def call(x, **kwargs):
        out = fn(x, **kwargs)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)):
            _fail(label, f"must return SurrogateResult(token_loss, stats); got {type(out).__name__}.")
        token_loss, stats = out
        if tuple(token_loss.shape) != tuple(x.ratio.shape):
            _fail(label, f"token_loss has shape {tuple(token_loss.shape)}; expected {tuple(x.ratio.shape)} "
                         "like the ratio.")
        _check_gradient(label, "token_loss", token_loss, x.logprobs)
        if not bool(torch.isfinite(torch.where(x.mask, token_loss.detach(), 0.0)).all()):
            _fail(label, "token_loss has NaN or inf on loss tokens.")
        _check_stats(label, stats)
        return SurrogateResult(token_loss, stats)

    call.__qualname__ = getattr(fn, "__qualname__", "surrogate")
    return call


class CheckedLoss:
    """A user's whole policy loss, with its output checked at every call."""

    def __init__(self, fn: Callable, kwargs: dict, label: str):
        self.fn, self.kwargs, self.label = fn, kwargs, label

    def __call__(self, inputs, normalizer=None) -> PolicyLossResult:
        out = self.fn(inputs, normalizer=normalizer, **self.kwargs)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)):
            _fail(self.label, f"must return PolicyLossResult(loss, stats); got {type(out).__name__}.")
        loss, stats = out
        if loss.dim() != 0 or not loss.is_floating_point():
            _fail(self.label, f"the loss must be a 0-dim float tensor; got shape {tuple(loss.shape)}, {loss.dtype}.")
        _check_gradient(self.label, "loss", loss, inputs.logprobs)
        if not bool(torch.isfinite(loss.detach())):
            _fail(self.label, f"the loss is {float(loss)}; it must be finite.")
        _check_stats(self.label, stats)
        return PolicyLossResult(loss, declared(stats))

    def __repr__(self) -> str:
        return f"CheckedLoss({self.label})"
