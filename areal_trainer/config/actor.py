"""Schema of ``actor`` (PPOActorConfig, also used for ``ref``) and ``critic`` (PPOCriticConfig).

Names and defaults are AReaL's. Every rule that AReaL only checks at run time is checked at start-up,
before any model loads: the keys' own values here, the rules of the policy loss and of the advantage
stages where they are bound (``components/loss.py``, ``components/advantage.py``).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from . import maths as m
from .base import at_least_one, fraction, is_number, number_in, one_of
from .parts import (
    AdvantageConfig,
    NormConfig,
    PolicyLossConfig,
    RejectionSamplingConfig,
    TrainEngineConfig,
    _json_problems,
)


@dataclass
class PPOActorConfig(TrainEngineConfig):
    """The policy: its model, and every knob of the advantage and policy-loss computation."""

    # -- PPO core ---------------------------------------------------------------------------
    ppo_n_minibatches: int = 4
    """Optimizer steps per training iteration: the batch is split into this many minibatches."""
    eps_clip: float = 0.2
    """Lower clip epsilon; also the upper one unless ``eps_clip_higher`` is set."""
    eps_clip_higher: Optional[float] = None
    """Upper clip epsilon for asymmetric (DAPO clip-higher) clipping: ratio in [1-eps_clip, 1+eps_clip_higher]."""
    c_clip: Optional[float] = None
    """Dual-clip constant (> 1): caps the loss of negative-advantage tokens at c*|A|. null disables."""
    m2_threshold: Optional[float] = None
    """M2PO second-moment threshold; null disables."""
    importance_sampling_level: str = "token"
    """``token`` (PPO) or ``sequence`` (GSPO: geometric mean of the token ratios)."""
    loss_agg_mode: str = "token-mean"
    """How per-token losses become one scalar: ``token-mean`` (global over the optimizer step, AReaL/DAPO),
    ``seq-mean-token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-sum-norm`` (Dr.GRPO: sum / max_new_tokens)."""
    # -- rewards ----------------------------------------------------------------------------
    reward_norm: Optional[NormConfig] = None
    """Normalisation of the per-sequence scalar reward (GRPO: group/group)."""
    reward_scaling: float = 1.0
    """Multiplies the reward after ``reward_bias`` is added (see ``reward_bias``)."""
    reward_bias: float = 0.0
    """The reward becomes clip((r + reward_bias) * reward_scaling, -reward_clip, reward_clip)."""
    reward_clip: float = 20.0
    """Bound of the scaled reward's absolute value (see ``reward_bias``)."""
    overlong_reward_penalty: bool = False
    """DAPO soft overlong punishment: linear penalty over the last ``overlong_tokens`` before max_new_tokens."""
    overlong_tokens: Optional[int] = None
    """Length of the penalised zone at the end of the answer budget (DAPO: 512)."""
    overlong_penalty_factor: Optional[float] = None
    """Penalty at ``max_new_tokens``: 0 at the start of the zone, falling linearly to -factor (DAPO: 1.0)."""
    mask_no_eos_with_zero: bool = False
    """Replace the outcome reward of truncated rows (no EOS) with 0."""
    max_new_tokens: int = 1024
    """Response length limit used by the overlong penalty and Dr.GRPO's normaliser (= gconfig.max_new_tokens)."""
    token_rewards_as_adv: bool = True
    """Process (token) rewards are added to the normalised advantages (true) or folded into GAE (false)."""
    # -- advantage --------------------------------------------------------------------------
    discount: float = 1.0
    """GAE gamma."""
    gae_lambda: Any = 1.0
    """GAE lambda: a float, or an import path to a function of a GAELambdaContext returning [B] lambdas."""
    gae_lambda_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of a callable ``gae_lambda`` (ignored for a float)."""
    gae_timestep_unit: str = "token"
    """GAE steps over generated ``token``s or generated ``turn``s (needs ``turn_ids`` from the workflow)."""
    adv_norm: Optional[NormConfig] = None
    """Token-level advantage normalisation after GAE."""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """Staged, pluggable advantage computation."""
    # -- KL to the reference policy ---------------------------------------------------------
    kl_ctl: float = 0.1
    """KL coefficient; > 0 needs a ``ref`` section. The presets set 0."""
    kl_estimator: str = "k1"
    """Per-token estimator of KL(policy || ref) in the reward: ``k1`` (log-ratio), ``k2`` or ``k3``."""
    # -- SAPO -------------------------------------------------------------------------------
    use_sapo_loss: bool = False
    """Soft sigmoid gates instead of hard clipping; needs use_decoupled_loss=false."""
    sapo_tau_pos: float = 1.0
    """SAPO gate temperature for tokens with a positive advantage (> 0)."""
    sapo_tau_neg: float = 1.05
    """SAPO gate temperature for tokens with a zero or negative advantage (> 0)."""
    # -- CISPO ------------------------------------------------------------------------------
    use_cispo_loss: bool = False
    """CISPO (MiniMax-M1, arXiv:2506.13585): a REINFORCE term weighted by the stop-gradient importance ratio
    clipped to [1 - eps_clip, 1 + eps_clip_higher], so every token keeps a gradient; token-level ratios only,
    not with SAPO (AReaL's key; the same as ``loss.surrogate.implementation=cispo``)."""
    # -- off-policy correction ----------------------------------------------------------------
    recompute_logprob: bool = False
    """Recompute pi_old with the current weights before the update (without the decoupled loss)."""
    use_decoupled_loss: bool = False
    """Decoupled PPO with behaviour / proximal / current policies."""
    rejection_sampling: Optional[RejectionSamplingConfig] = None
    """IcePop/KPop token masks and behaviour-weight clamping (decoupled loss only)."""
    prox_logp_method: str = "recompute"
    """``recompute`` (forward pass), ``loglinear`` (version interpolation, no forward) or ``metrics``."""
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Pluggable policy loss: its surrogate, or the whole loss, by built-in name or import path."""
    # -- robustness ---------------------------------------------------------------------------
    max_consecutive_nonfinite_steps: int = 3
    """A non-finite loss or grad norm skips the optimizer step; this many in a row stop the run."""
    # -- weights pushed to inference servers (rollout.backend=<engine>:d<N>p1t<T> or rollout.server_addrs) ------
    weight_update_mode: str = "disk"
    """``disk`` (safetensors files the servers read) or ``xccl`` (a collective group: NCCL on GPUs, gloo on CPU)."""
    weight_update_timeout: float = 600.0
    """Seconds one weight update may take in all; a server that has not taken the weights by then stops the run."""
    weight_update_dir: Optional[str] = None
    """Where ``disk`` updates are written (null: the run directory's ``servers/weights``); the servers must read it."""

    def check(self, key: str) -> list[str]:
        p = super().check(key)
        if self.is_critic:
            p.append(f"{key}.is_critic: got true; the value model is the `critic` section here, not {key}. "
                     f"Remove {key}.is_critic.")
        p += one_of(f"{key}.importance_sampling_level", self.importance_sampling_level, m.IS_LEVELS)
        p += one_of(f"{key}.kl_estimator", self.kl_estimator, m.KL_ESTIMATORS)
        p += one_of(f"{key}.prox_logp_method", self.prox_logp_method, m.PROX_LOGP_METHODS)
        p += one_of(f"{key}.gae_timestep_unit", self.gae_timestep_unit, m.GAE_UNITS)
        p += one_of(f"{key}.loss_agg_mode", self.loss_agg_mode, m.LOSS_AGG_MODES)
        p += at_least_one(f"{key}.ppo_n_minibatches", self.ppo_n_minibatches)
        p += at_least_one(f"{key}.max_consecutive_nonfinite_steps", self.max_consecutive_nonfinite_steps)
        p += at_least_one(f"{key}.max_new_tokens", self.max_new_tokens)
        p += number_in(f"{key}.kl_ctl", self.kl_ctl, 0)
        p += number_in(f"{key}.reward_clip", self.reward_clip, 0, open_low=True)
        p += one_of(f"{key}.weight_update_mode", self.weight_update_mode, ("disk", "xccl"))
        p += number_in(f"{key}.weight_update_timeout", self.weight_update_timeout, 0, open_low=True, unit="seconds")
        p += fraction(f"{key}.discount", self.discount)
        p += _lambda_problems(key, self.gae_lambda) + _json_problems(f"{key}.gae_lambda_kwargs", self.gae_lambda_kwargs)
        if self.overlong_reward_penalty:
            p += _overlong_problems(key, self.overlong_tokens, self.overlong_penalty_factor, self.max_new_tokens)
        return p  # the loss's and the advantage stages' rules are checked where they are bound (components/)

    def warnings(self, key: str) -> list[str]:
        w = []
        if self.rejection_sampling is not None and not self.use_decoupled_loss:
            w.append(f"{key}.rejection_sampling is set but use_decoupled_loss=false: filtering is ignored.")
        if self.use_decoupled_loss and self.rejection_sampling is None:
            w.append(f"{key}.use_decoupled_loss=true without rejection_sampling: no behaviour importance weight "
                     "is applied (AReaL's old default was {metric: ratio, upper: 5.0}).")
        if self.prox_logp_method == "loglinear" and not self.use_decoupled_loss:
            w.append(f"{key}.prox_logp_method=loglinear has no effect without use_decoupled_loss=true.")
        return w


@dataclass
class PPOCriticConfig(TrainEngineConfig):
    """The value model of PPO: initialised from ``path`` with a scalar value head."""

    is_critic: bool = True
    """Marks the value model (AReaL's flag); must be true here."""
    ppo_n_minibatches: int = 4
    """Critic optimizer steps per training iteration: the batch is split into this many minibatches."""
    eps_clip: float = 0.5
    """Value clipping range, in absolute value units."""
    mask_no_eos_with_zero: bool = False
    """Kept for AReaL configs; no effect on the critic (``actor.mask_no_eos_with_zero`` acts)."""

    def check(self, key: str) -> list[str]:
        p = super().check(key) + at_least_one(f"{key}.ppo_n_minibatches", self.ppo_n_minibatches)
        if not self.is_critic:
            p.append(f"{key}.is_critic: got false; the critic section is the value model (remove the key, "
                     "or set it to true as AReaL requires).")
        p += number_in(f"{key}.eps_clip", self.eps_clip, 0, open_low=True, note="the value clip range")
        if self.optimizer is None:
            p.append(f"{key}.optimizer: the critic is trained and needs an optimizer section.")
        return p


def _lambda_problems(key: str, lam: Any) -> list[str]:
    if isinstance(lam, bool):
        return [f"{key}.gae_lambda: got a bool ({lam}); give a float in [0, 1] or an import path."]
    if is_number(lam):
        return number_in(f"{key}.gae_lambda", lam, 0, 1, finite=True, note="a static lambda")
    if isinstance(lam, str):
        if not lam.strip():
            return [f"{key}.gae_lambda: got an empty string; give a float or 'package.module.function'."]
        return []
    return [f"{key}.gae_lambda: got {lam!r} ({type(lam).__name__}); give a float or an import path string."]


def _overlong_problems(key: str, tokens: Any, factor: Any, max_new: int) -> list[str]:
    p = []
    if tokens is None or factor is None:
        p.append(f"{key}.overlong_reward_penalty=true needs {key}.overlong_tokens and {key}.overlong_penalty_factor "
                 "(DAPO uses 512 and 1.0).")
        return p
    return number_in(f"{key}.overlong_tokens", tokens, 0, max_new, open_low=True,
                     high_label=f"{key}.max_new_tokens={max_new}") + number_in(
        f"{key}.overlong_penalty_factor", factor, 0)
