"""Checks of what user functions return (and that they leave their inputs alone).

Every failure is a :class:`~areal_trainer.errors.PluginOutputError` (the command line shows it as
one ``Error:`` line) whose message starts with the plugin's label (its config key and
implementation), names the offending field and says what to return instead. Shape, device and
dtype checks read metadata only; the value checks (finite, binary mask) of one result are fused
into a single host synchronisation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import PluginOutputError
from .datatypes import EXTRAS_WHITELIST, AdvantageResult, OutcomeResult, TemporalResult


def check_tensor(label: str, name: str, t: Any, shape: tuple[int, ...], device: torch.device,
                 *, allow_int: bool = False, allow_bool: bool = False) -> None:
    """``t`` is a tensor of ``shape`` on ``device`` with a floating (or allowed) dtype."""
    if not isinstance(t, torch.Tensor):
        raise PluginOutputError(f"{label}: {name} must be a torch.Tensor; got {type(t).__name__}. Build it with "
                                "torch operations on the input tensors.")
    if tuple(t.shape) != tuple(shape):
        raise PluginOutputError(f"{label}: {name} must have shape {tuple(shape)}; got {tuple(t.shape)}.")
    if t.device != device:
        raise PluginOutputError(f"{label}: {name} is on {t.device}; it must stay on the input device {device} "
                                "(create new tensors with device= of an input, or use torch.zeros_like).")
    ok = t.is_floating_point() or (allow_int and not t.is_complex() and t.dtype != torch.bool) or (
        allow_bool and t.dtype == torch.bool)
    if not ok:
        raise PluginOutputError(f"{label}: {name} must be a floating-point tensor; got {t.dtype}. Convert it "
                                "with .float().")


def check_values(label: str, finite: Mapping[str, torch.Tensor],
                 binary: Mapping[str, torch.Tensor] | None = None) -> None:
    """All of ``finite`` are finite and all of ``binary`` are 0/1, in one host sync.

    ``min`` and ``max`` propagate NaN and expose infinities, so one fused reduction per tensor (no
    temporary) decides finiteness; ``t * (1 - t)`` vanishes exactly on 0 and 1.
    """
    names, flags, seen = [], [], set()
    for name, t in finite.items():
        if id(t) in seen:  # the same tensor under two names (e.g. logprobs and extras['prox_logp'])
            continue
        seen.add(id(t))
        if t.is_floating_point() and t.numel():
            names.append((name, "contains NaN or inf; values must be finite (guard divisions and logarithms, "
                                "e.g. add an epsilon to a standard deviation)"))
            flags.append(torch.isfinite(torch.stack(torch.aminmax(t)).float()).all())
    for name, t in (binary or {}).items():
        if t.dtype != torch.bool:
            names.append((name, "must be binary (0/1); return a bool tensor or 0/1 values"))
            t = t if t.is_floating_point() else t.float()
            flags.append((t * (1 - t)).abs().sum() == 0)
    if not flags:
        return
    for (name, what), ok in zip(names, torch.stack(flags).tolist()):
        if not ok:
            raise PluginOutputError(f"{label}: {name} {what}.")


def check_outcome(res: Any, *, label: str, n_rows: int, n_logical: int | None, device: torch.device,
                  allow_int: bool) -> None:
    if not isinstance(res, OutcomeResult):
        raise PluginOutputError(f"{label}: must return an OutcomeResult; got {type(res).__name__}.")
    check_tensor(label, "OutcomeResult.rewards", res.rewards, (n_rows,), device, allow_int=allow_int)
    finite = {"OutcomeResult.rewards": res.rewards}
    if res.normalization_rewards is not None:
        if n_logical is None:
            raise PluginOutputError(f"{label}: OutcomeResult.normalization_rewards needs the batch's complete "
                                    "TrajBatchMeta (from concat_batch); this batch has none, so return "
                                    "normalization_rewards=None when inputs.meta is None.")
        check_tensor(label, "OutcomeResult.normalization_rewards", res.normalization_rewards, (n_logical,), device)
        finite["OutcomeResult.normalization_rewards"] = res.normalization_rewards
    check_values(label, finite)


def check_temporal(res: Any, *, label: str, shape: tuple[int, int], device: torch.device) -> None:
    if not isinstance(res, TemporalResult):
        raise PluginOutputError(f"{label}: must return a TemporalResult; got {type(res).__name__}.")
    fields = {f"TemporalResult.{n}": getattr(res, n) for n in ("advantages", "returns", "total_rewards")}
    for name, t in fields.items():
        check_tensor(label, name, t, shape, device)
    check_values(label, fields)


def check_process(adv: Any, *, label: str, shape: tuple[int, int], device: torch.device) -> None:
    check_tensor(label, "advantages", adv, shape, device)
    check_values(label, {"advantages": adv})


def check_result(res: Any, *, label: str, shape: tuple[int, int], device: torch.device, trusted: bool = False) -> None:
    """Shapes, device, dtypes, finite values, a binary mask and whitelisted extras.

    ``trusted`` (the framework's own pipeline) limits the value checks to the advantages and
    returns, which every input reaches, and skips the 0/1 check of a mask it built itself.
    """
    if not isinstance(res, AdvantageResult):
        raise PluginOutputError(f"{label}: must return an AdvantageResult; got {type(res).__name__}.")
    finite: dict[str, torch.Tensor] = {}
    for name in ("advantages", "returns", "logprobs", "total_rewards", "kl_rewards"):
        check_tensor(label, f"AdvantageResult.{name}", getattr(res, name), shape, device)
        finite[f"AdvantageResult.{name}"] = getattr(res, name)
    check_tensor(label, "AdvantageResult.loss_mask", res.loss_mask, shape, device, allow_bool=True)
    check_tensor(label, "AdvantageResult.outcome_rewards", res.outcome_rewards, shape[:1], device)
    finite["AdvantageResult.outcome_rewards"] = res.outcome_rewards
    if not isinstance(res.extras, Mapping):
        raise PluginOutputError(f"{label}: AdvantageResult.extras must be a mapping; got "
                                f"{type(res.extras).__name__}.")
    unknown = sorted(set(res.extras) - EXTRAS_WHITELIST)
    if unknown:
        raise PluginOutputError(f"{label}: AdvantageResult.extras may only hold "
                                f"{', '.join(sorted(EXTRAS_WHITELIST))}; got {', '.join(map(repr, unknown))} "
                                "(rollout fields such as input_ids, values or rewards cannot be overwritten).")
    for name, t in res.extras.items():
        extra_shape = shape[:1] if name == "is_truncated" else shape
        check_tensor(label, f"AdvantageResult.extras[{name!r}]", t, extra_shape, device, allow_int=True,
                     allow_bool=True)
        finite[f"AdvantageResult.extras[{name!r}]"] = t
    if trusted:
        finite = {k: finite[k] for k in ("AdvantageResult.advantages", "AdvantageResult.returns")}
    check_values(label, finite, None if trusted else {"AdvantageResult.loss_mask": res.loss_mask})


def tensor_versions(data: Mapping[str, Any]) -> dict[str, int]:
    """In-place modification counters of the tensors in ``data``."""
    return {k: v._version for k, v in data.items() if isinstance(v, torch.Tensor)}


def check_unmodified(label: str, data: Mapping[str, Any], before: Mapping[str, int]) -> None:
    changed = [k for k, v in tensor_versions(data).items() if before.get(k) != v]
    if changed:
        raise PluginOutputError(f"{label}: modified the input tensor(s) {', '.join(map(repr, changed))} in place; "
                                "return new tensors instead (e.g. x * 2, not x.mul_(2)).")
