"""Bookkeeping around the training: checkpoints (``saver``, ``recover``), evaluation (``evaluator``), metrics
(``stats_logger``) and the supervised warm start (``sft_warmup``)."""

from dataclasses import dataclass, field

from .base import Checked, integer_at_least, number_in, one_of


@dataclass
class _Freq(Checked):
    freq_epochs: int | None = None
    """At the end of every this many epochs (null: not by epochs)."""
    freq_steps: int | None = None
    """After every this many training steps (null: not by steps)."""
    freq_secs: float | None = None
    """After a step, when at least this many seconds have passed since the last time (null: not by time)."""

    def check(self, key: str) -> list[str]:
        return [x for n in ("freq_epochs", "freq_steps", "freq_secs")
                for x in number_in(f"{key}.{n}", getattr(self, n), 0, open_low=True, nullable=True)]


@dataclass
class SaverConfig(_Freq):
    """Checkpoints (weights, optimizer, LR schedule, data position, RNG), written atomically."""

    keep_last: int = 2
    """Keep only this many newest checkpoints (older ones are deleted after a new one is complete)."""


@dataclass
class EvaluatorConfig(_Freq):
    """Held-out evaluation on ``valid_dataset`` with ``eval_gconfig`` (none when ``valid_dataset`` is null).

    It reports accuracy (``eval/accuracy``, ``eval/pass@k``) only from a *verifier*, a reward source whose
    value says right or wrong; without one it reports the mean reward (``eval/reward``) and says what that
    reward is. With a teacher it also reports the reverse KL to the teacher (``eval/distill/*``)."""

    eval_before_train: bool = False
    """Also evaluate once before the first training step (the run always evaluates after the last one)."""
    verifier: str | None = None
    """Which reward source's verdict is the held-out accuracy: one of the functions of ``reward.fn``, by
    import path or name (correct when its value is positive, or as the function declares: the built-in
    ``areal_trainer.reward.code.unit_tests`` only when every test passes); ``none``: report no accuracy.
    null (auto): a built-in verifier among ``reward.fn`` (``areal_trainer.reward.math.gsm8k_reward_fn``,
    ``unit_tests``), else the only reward function when every value it gives on the held-out set is 0 or 1,
    else (a reward model, a scoring service, a mix without a verifier) no accuracy. Agent runs
    (``rollout.agent``) use the agent's episode reward, a verifier when every held-out episode scores 0 or 1
    (before ``rollout.turn_discount``); leave it null there, or ``none``."""

    def check(self, key: str) -> list[str]:
        p = super().check(key)
        if self.verifier is not None and (not isinstance(self.verifier, str) or not self.verifier.strip()):
            p.append(f"{key}.verifier: got {self.verifier!r}; give the import path or name of one of reward.fn's "
                     "functions, none (no accuracy), or null (auto).")
        return p


@dataclass
class RecoverConfig(_Freq):
    """Resume: ``auto``/``on`` resume from the newest complete checkpoint of the run directory."""

    mode: str = "disabled"
    """``auto`` or ``on``: resume; ``disabled`` or ``off``: start fresh, and refuse a run directory that
    already holds checkpoints. Its ``freq_*`` keys write checkpoints too, like ``saver``'s."""
    retries: int = 3
    """AReaL's automatic restarts; ignored here (restart the command with ``mode=auto``)."""

    def check(self, key: str) -> list[str]:
        return super().check(key) + one_of(f"{key}.mode", self.mode, ("on", "auto", "off", "disabled"))


@dataclass
class WandbConfig(Checked):
    """Weights & Biases logging of the metrics (``wandb.init`` settings); the run is named
    <experiment_name>/<trial_name>."""

    mode: str = "offline"
    """``offline`` (default; never touches the network), ``online``, or ``disabled``."""
    project: str = "areal_trainer"
    """W&B project of the runs."""
    entity: str | None = None
    """W&B user or team (null: the default entity of the login)."""
    tags: list[str] = field(default_factory=list)
    """Tags of the W&B run."""

    def check(self, key: str) -> list[str]:
        return one_of(f"{key}.mode", self.mode, ("offline", "online", "disabled"))


@dataclass
class StatsLoggerConfig(Checked):
    """What a run reports besides ``metrics.jsonl``: wandb, the console's progress bar, plots and samples."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress_bar: bool = True
    """A progress bar on the console with the live reward and the latest held-out accuracy (the run log
    records its state once per step either way)."""
    plot: bool = True
    """Write ``curves.png`` (reward and held-out accuracy) into the run directory at the end."""
    samples_per_step: int = 4
    """Sampled trajectories appended to ``samples.jsonl`` (and a wandb table) each step, 0 disables:
    the first answer of each prompt group in batch order, then the second answers, ... (no randomness).
    Each record holds the prompt and completion text, the reward, the advantage (the mean over the
    row's loss tokens), the answer length and the policy versions of the sampled tokens."""

    def check(self, key: str) -> list[str]:
        return integer_at_least(f"{key}.samples_per_step", self.samples_per_step, 0, note="0 writes no samples.jsonl")


@dataclass
class SFTWarmupConfig(Checked):
    """Supervised warm start on the training set's reference answers, run before RL."""

    steps: int | None = None
    """null = only for built-in (randomly initialised) models; 0 disables. It trains on the rows with something
    to imitate (a reference answer as text, a ``demonstration`` column or ``demonstration_messages``); with none
    such, null skips it with a notice and a number above 0 is a configuration error."""
    lr: float = 3e-3
    """Peak learning rate of the warm start (AdamW, cosine decay to a tenth)."""
    batch_size: int = 32
    """Rows (prompt + reference answer) per warm-start step, drawn at random with replacement."""
    warmup_steps: int = 20
    """Steps of linear learning-rate warm-up."""
    cache: bool = True
    """Reuse the result of an identical earlier warm start (same model, data, settings, seed and code),
    stored under ``$AREAL_TRAINER_CACHE`` (default ``~/.cache/areal_trainer``)."""

    def check(self, key: str) -> list[str]:
        return integer_at_least(f"{key}.steps", self.steps, 0, nullable=True)

