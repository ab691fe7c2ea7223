"""The root of the configuration tree (``TrainerConfig``); its sections are in the modules beside this one:
``sampling.py``, ``data.py``, ``actor.py`` (with ``parts.py``), ``rollout.py``, ``bookkeeping.py``,
``launch.py``. Key names follow AReaL's ``PPOConfig`` where AReaL has the key.

The schema is code; YAML under ``conf/`` holds values only. ``validate.py`` walks the whole tree and
adds the rules that span sections (``kl_ctl > 0`` needs ``ref``, group sizes, ...).
"""

from dataclasses import dataclass, field
from typing import Optional

from .actor import PPOActorConfig, PPOCriticConfig
from .base import Checked, at_least_one
from .bookkeeping import EvaluatorConfig, RecoverConfig, SaverConfig, SFTWarmupConfig, StatsLoggerConfig
from .data import DatasetConfig
from .environment import EnvironmentConfig
from .launch import ClusterConfig, ParallelConfig, SchedulerConfig
from .reward import RewardConfig
from .rollout import RolloutConfig
from .sampling import GenerationHyperparameters
from .teacher import TeacherConfig

__all__ = ["DatasetConfig", "GenerationHyperparameters", "TrainerConfig"]


@dataclass
class TrainerConfig(Checked):
    """Root of the configuration tree."""

    experiment_name: str = "areal_trainer"
    """Name of the experiment: the run directory's parent (see ``cluster.fileroot``) and the W&B group."""
    trial_name: str = "trial0"
    """Name of this run within the experiment: the run directory's last part."""
    algorithm: str = "custom"
    """Name of the algorithm preset (set by conf/algo/*.yaml); used in run names and sweep tables."""
    seed: int = 1
    """Seed of the data order, the sampling and any random initialisation."""
    device: str = "auto"
    """``auto`` = CUDA when available, else CPU; or ``cpu``, ``cuda``, ``cuda:1``."""
    total_train_epochs: int = 1
    """Passes over the training prompts."""
    total_train_steps: Optional[int] = None
    """Stop after this many training steps if that comes before ``total_train_epochs`` (null: no step limit).
    When the epochs end first, a notice at start-up names the step the run stops at and the
    ``total_train_epochs`` that would allow this many."""
    tokenizer_path: Optional[str] = None
    """null = actor.path."""
    allow_builtin_model_on_any_data: bool = False
    """Let a built-in model or tokenizer (``builtin:*`` actor.path / tokenizer_path) run on data other than the
    built-in task. Off by default, a configuration error: the built-in word-level tokenizer knows only the
    built-in task's words, so real data becomes mostly ``<unk>`` and the run scores 0. For plumbing tests."""
    dynamic_bs: bool = False
    """With a dynamic filter: train on whatever one round of sampling accepted (variable batch)."""
    gconfig: GenerationHyperparameters = field(default_factory=GenerationHyperparameters)
    """Sampling of the training rollouts."""
    eval_gconfig: GenerationHyperparameters = field(default_factory=GenerationHyperparameters)
    """Sampling of the held-out evaluation."""
    train_dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """The training prompts."""
    valid_dataset: Optional[DatasetConfig] = None
    """The held-out prompts of the evaluation (null: no evaluation, whatever ``evaluator`` schedules)."""
    actor: PPOActorConfig = field(default_factory=PPOActorConfig)
    ref: Optional[PPOActorConfig] = None
    """The frozen reference policy of the KL penalty, needed when ``actor.kl_ctl > 0``. Only ``path`` and
    ``dtype`` are read (the same path as ``actor.path``: a copy of the policy as RL starts)."""
    critic: Optional[PPOCriticConfig] = None
    """The value model of PPO's GAE (null: no critic, as in GRPO)."""
    teacher: Optional[TeacherConfig] = None
    """On-policy distillation: a frozen teacher (or several, MOPD) scores the student's sampled tokens
    (null: no teacher). See docs/distillation.md."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    """An environment from a hub as the task: its rows, tools, turns and scoring (docs/environments.md)."""
    sft_warmup: SFTWarmupConfig = field(default_factory=SFTWarmupConfig)
    saver: SaverConfig = field(default_factory=SaverConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    recover: RecoverConfig = field(default_factory=RecoverConfig)
    stats_logger: StatsLoggerConfig = field(default_factory=StatsLoggerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def check(self, key: str) -> list[str]:
        p = []
        p += at_least_one("total_train_epochs", self.total_train_epochs)
        p += at_least_one("total_train_steps", self.total_train_steps, nullable=True)
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            p.append(f"device: got {self.device!r}; use auto, cpu, cuda or cuda:<index>.")
        return p

