"""Building blocks of the model configs: normalisation, rejection sampling, optimizer,
micro-batching, advantage stages, and the fields every train engine shares.

Key names and defaults follow AReaL's ``cli_args.py`` so that AReaL configs carry over.
Typing uses ``Optional``/``Dict`` because OmegaConf 2.3 structured configs do not accept ``X | None``.
"""

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..advantage.settings import Norm
from ..dtypes import DTYPE_NAMES
from . import maths
from .base import Checked, at_least_one, fraction, number_in, one_of

# The maths' names are spelled in ``config/maths.py``;
# these belong to the training infrastructure (train/models/optim.py, model/load.py) and live here.
OPTIMIZERS = ("adam", "adamw", "sgd")
LR_SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("auto", *DTYPE_NAMES)
PEFT_TYPES = ("lora",)


def _json_problems(key: str, value: Any) -> list[str]:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        return [f"{key}: kwargs must be JSON-serialisable (plain numbers, strings, lists, dicts): {e}."]
    return []


@dataclass
class NormConfig(Norm, Checked):
    """Normalisation of rewards (``[B]``) or advantages (``[B, S]``): ``(x - mean) / (std + eps)``
    (the fields are ``advantage.settings.Norm``'s)."""

    def check(self, key: str) -> list[str]:
        levels = maths.NORM_LEVELS
        p = one_of(f"{key}.mean_level", self.mean_level, levels)
        p += one_of(f"{key}.std_level", self.std_level, levels)
        if self.uses_group_statistics:
            p += at_least_one(f"{key}.group_size", self.group_size, note="usually ${gconfig.n_samples}")
        return p + number_in(f"{key}.eps", self.eps, 0, finite=True)


@dataclass
class RejectionSamplingConfig(Checked):
    """Masks or clamps tokens whose proximal/behaviour divergence is out of bounds (IcePop, KPop).

    Only used with ``actor.use_decoupled_loss=true``.
    """

    imports_torch = True  # its rules are the loss's (loss/rejection.py): collect(light=True) leaves them out

    level: str = "token"
    """``token``, or ``sequence`` (every token of a sequence shares the decision)."""
    action: str = "mask"
    """``mask`` drops out-of-bound tokens from the loss; ``clamp`` clamps the behaviour weight (ratio only)."""
    metric: str = "ratio"
    """``ratio`` (pi_prox/pi_behav), ``kl_k1``/``kl_k2``/``kl_k3``, or ``binary_kl`` (KPop)."""
    agg: str = "mean"
    """Sequence-level aggregation: ``sum``, ``mean`` or ``max`` (ignored at token level)."""
    upper: float = 5.0
    """A unit is kept iff metric <= upper (inclusive)."""
    lower: Optional[float] = None
    """Optional lower bound (kept iff lower <= metric). Not allowed with ``binary_kl``."""

    def check(self, key: str) -> list[str]:
        return maths.rejection_problems(key, level=self.level, action=self.action, metric=self.metric,
                                        agg=self.agg, upper=self.upper, lower=self.lower)

    def warnings(self, key: str) -> list[str]:
        if self.level == "token" and self.agg != "mean":
            return [f"{key}.agg={self.agg!r} is ignored when level='token'."]
        return []


@dataclass
class OptimizerConfig(Checked):
    """Optimizer and learning-rate schedule (AdamW by default)."""

    type: str = "adam"
    """``adam`` (decoupled weight decay, i.e. AdamW), ``adamw`` (same) or ``sgd``."""
    lr: float = 1e-3
    """Peak learning rate (reached at the end of the warm-up)."""
    weight_decay: float = 0.01
    """Weight decay (decoupled from the gradient for ``adam``/``adamw``)."""
    beta1: float = 0.9
    """Adam's first-moment decay."""
    beta2: float = 0.999
    """Adam's second-moment decay."""
    eps: float = 1e-8
    """Adam's denominator epsilon."""
    min_lr_ratio: float = 0.0
    """Final lr as a fraction of ``lr`` for the linear and cosine schedules."""
    lr_scheduler_type: str = "constant"
    """``constant``, ``linear`` or ``cosine`` (after the warm-up)."""
    warmup_steps_proportion: float = 0.001
    """Fraction of the run's training steps spent in linear warm-up. The schedule advances once per training
    step (one batch), whatever ``ppo_n_minibatches`` is: every optimizer step of a batch uses the same lr."""
    gradient_clipping: float = 1.0
    """Max global grad norm (0 or less disables clipping)."""

    def check(self, key: str) -> list[str]:
        p = one_of(f"{key}.type", self.type, OPTIMIZERS)
        p += one_of(f"{key}.lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULES)
        p += number_in(f"{key}.lr", self.lr, 0, open_low=True)
        return p + fraction(f"{key}.warmup_steps_proportion", self.warmup_steps_proportion) + fraction(
            f"{key}.min_lr_ratio", self.min_lr_ratio)


@dataclass
class MicroBatchSpec(Checked):
    """How one optimizer step's rows are split into forward/backward micro-batches."""

    n_mbs: int = 1
    """Minimum number of micro-batches."""
    granularity: int = 1
    """Rows that must stay in the same micro-batch (e.g. a prompt's group)."""
    max_tokens_per_mb: Optional[int] = None
    """Token budget per micro-batch; more micro-batches are used when exceeded."""
    n_mbs_divisor: int = 1
    """The number of micro-batches is rounded up to a multiple of this."""
    packing_algorithm: str = "ffd"
    """How rows are balanced over micro-batches: ``ffd`` (largest first into the lightest part)."""

    def check(self, key: str) -> list[str]:
        p = []
        if self.packing_algorithm == "kk":
            p.append(f"{key}.packing_algorithm: 'kk' (Karmarkar-Karp) is not supported here; micro-batches are "
                     f"balanced by first-fit decreasing: set {key}.packing_algorithm=ffd (the default).")
        else:
            p += one_of(f"{key}.packing_algorithm", self.packing_algorithm, ("ffd",))
        for name in ("n_mbs", "granularity", "n_mbs_divisor"):
            p += at_least_one(f"{key}.{name}", getattr(self, name))
        return p + at_least_one(f"{key}.max_tokens_per_mb", self.max_tokens_per_mb, nullable=True)


@dataclass
class StageConfig(Checked):
    """One stage of the advantage computation: a built-in name or an import path, plus kwargs."""

    implementation: str = "auto"
    """A built-in name (``auto``: the stage's default) or an import path ``package.module.function``."""
    kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the function."""

    def check(self, key: str) -> list[str]:
        p = []
        if not isinstance(self.implementation, str) or not self.implementation:
            p.append(f"{key}.implementation: got {self.implementation!r}; give a built-in name or "
                     "'package.module.function'.")
        return p + _json_problems(f"{key}.kwargs", self.kwargs)


@dataclass
class AdvantageConfig(Checked):
    """``actor.advantage``: replace the whole advantage computation, or single stages of it."""

    compute: Optional[StageConfig] = field(default_factory=lambda: StageConfig(implementation="default"))
    """``default`` (the staged pipeline below), or an import path of a function replacing the whole
    advantage computation (then no stage may be set)."""
    outcome_reward_shaping: Optional[StageConfig] = None
    """Shapes the outcome rewards before bias/scale/clip and ``reward_norm`` (null/``auto``: ``identity``)."""
    estimator: Optional[StageConfig] = None
    """Temporal estimation of advantages and returns: ``token_gae`` or ``turn_gae`` (null/``auto``: by
    ``gae_timestep_unit``)."""
    process_adv_shaping: Optional[StageConfig] = None
    """Combines process (token) rewards with the advantages after ``adv_norm``: ``additive``, ``gvpo``,
    ``process_weighted`` (null/``auto``: the PRM mode passed with the batch, else ``additive``)."""
    group_baseline: Optional[StageConfig] = None
    """In place of ``reward_norm``: ``fn(GroupBaselineInputs, **kwargs) -> [B]`` scores (null/``auto``:
    ``reward_norm``)."""

    def check(self, key: str) -> list[str]:
        p: list[str] = []
        replaced = self.compute is not None and self.compute.implementation not in ("default", "auto")
        if self.compute is not None and not replaced and self.compute.kwargs:
            p.append(f"{key}.compute.kwargs: the default compute takes no kwargs (got {dict(self.compute.kwargs)}); "
                     "configure the stages (outcome_reward_shaping, estimator, process_adv_shaping) instead.")
        stages = {n: getattr(self, n) for n in ("outcome_reward_shaping", "estimator", "process_adv_shaping",
                                                "group_baseline")}
        if replaced:
            used = [n for n, s in stages.items() if s is not None]
            if used:
                p.append(f"{key}.compute.implementation={self.compute.implementation!r} replaces the whole computation "
                         f"and cannot be combined with stage entries ({', '.join(used)}); set them to null.")
        proc = self.process_adv_shaping
        if proc is not None and proc.implementation == "auto" and proc.kwargs:
            p.append(f"{key}.process_adv_shaping.kwargs: implementation 'auto' takes no kwargs "
                     f"(got {dict(proc.kwargs)}); name the implementation (e.g. gvpo) to pass kwargs.")
        return p


@dataclass
class PolicyLossConfig(Checked):
    """``actor.loss``: replace the surrogate of the policy loss, or the whole loss (``config/loss.py``)."""

    compute: Optional[StageConfig] = field(default_factory=lambda: StageConfig(implementation="default"))
    """``default`` (the staged loss), or an import path of ``fn(PolicyLossInputs, *, normalizer, **kwargs)
    -> PolicyLossResult`` replacing it."""
    surrogate: Optional[StageConfig] = None
    """null/``auto``: ``sapo`` with ``use_sapo_loss``, else ``clip``; or a built-in name (``clip``, ``sapo``,
    ...) or an import path of ``fn(SurrogateInputs, **kwargs) -> SurrogateResult``."""

    def check(self, key: str) -> list[str]:
        p: list[str] = []
        if self.compute is not None and self.compute.implementation == "default" and self.compute.kwargs:
            p.append(f"{key}.compute.kwargs: the default loss takes no kwargs (got {dict(self.compute.kwargs)}).")
        return p


@dataclass
class TrainEngineConfig(Checked):
    """What every trainable (or frozen) model shares: weights, precision, optimizer, micro-batching."""

    path: str = "builtin:tiny"
    """HF hub id or local directory; ``builtin:tiny`` is the built-in offline model; ``smollm2`` the packaged one."""
    init_from_scratch: bool = False
    """Build the architecture of ``path`` with random weights instead of loading them."""
    dtype: str = "auto"
    """``auto`` = bfloat16 on CUDA, float32 on CPU."""
    temperature: float = 1.0
    """Logits are divided by this before log-softmax in every training-side forward (= sampling temperature)."""
    optimizer: Optional[OptimizerConfig] = field(default_factory=OptimizerConfig)
    """null = forward-only (the reference model)."""
    mb_spec: MicroBatchSpec = field(default_factory=MicroBatchSpec)
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, more compute."""
    is_critic: bool = False
    """AReaL's flag for the value model; false for ``actor`` and ``ref`` (the critic is its own section)."""
    use_lora: bool = False
    """Train LoRA adapters (peft) instead of the whole model, base weights frozen (the critic: on its backbone,
    with the value head fully trained)."""
    lora_rank: int = 32
    """LoRA rank r of the adapters (>= 1)."""
    lora_alpha: int = 16
    """LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input, in [0, 1)."""
    target_modules: List[str] = field(default_factory=lambda: ["all-linear"])
    """Names of the Linear modules that get adapters; ``[all-linear]`` (peft's) = every Linear but the output head,
    for Llama/Qwen models the attention and MLP projections q/k/v/o_proj, gate/up/down_proj."""
    peft_type: str = "lora"
    """The PEFT method; only ``lora``."""
    freeze_vision: bool = True
    """An image-text-to-text model's vision encoder stays frozen (its projector and language model train); false
    trains it too. No effect on a text-only model. With ``use_lora`` the adapters sit on the language model only
    (docs/vlm.md)."""
    enable_tree_training: Optional[bool] = None
    """Shared-prefix training: rows that start with the same tokens (the answers of one prompt) are computed
    as one prefix plus their continuations, so every training-side forward and backward pays for unique
    tokens only. null (default) = on where the attention implementation takes the tree mask (sdpa, eager),
    else the unshared packed forward; true = require it (an error on other attention); false = off
    (``actor.enable_tree_training=false`` also makes HF generation prefill every sample's prompt itself)."""

    def check(self, key: str) -> list[str]:
        p = one_of(f"{key}.dtype", self.dtype, DTYPES)
        if not isinstance(self.path, str) or not self.path:
            p.append(f"{key}.path: got {self.path!r}; give a HF model id, a local directory or builtin:tiny.")
        p += number_in(f"{key}.temperature", self.temperature, 0, open_low=True,
                       note="use gconfig.greedy for greedy decoding")
        return p + self._lora_problems(key)

    def _lora_problems(self, key: str) -> list[str]:
        p = one_of(f"{key}.peft_type", self.peft_type, PEFT_TYPES,
                   "Only LoRA is implemented (peft's other methods are not).")
        p += at_least_one(f"{key}.lora_rank", self.lora_rank)
        p += number_in(f"{key}.lora_alpha", self.lora_alpha, 0, open_low=True)
        p += number_in(f"{key}.lora_dropout", self.lora_dropout, 0, 1, open_high=True)
        if self.use_lora and not self.target_modules:
            p.append(f"{key}.target_modules: empty; name the Linear modules that get adapters, e.g. "
                     "[q_proj,v_proj], or [all-linear].")
        return p
