"""The experiment-level schema (``TrainerConfig``): generation, data, rollout, reward, logging,
checkpointing. Key names follow AReaL's ``PPOConfig`` where AReaL has the key.

The schema is code; YAML under ``conf/`` holds values only. ``validate.py`` walks the whole tree
and adds the rules that span sections (``kl_ctl > 0`` needs ``ref``, group sizes, ...).
"""

import math
import string
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .actor import PPOActorConfig, PPOCriticConfig
from .base import Checked, at_least_one, fraction, is_number, one_of
from .parts import _json_problems


@dataclass
class GenerationHyperparameters(Checked):
    """Sampling settings of the rollout (``gconfig``) and of evaluation (``eval_gconfig``)."""

    n_samples: int = 1
    """Answers sampled per prompt: the group size G."""
    max_new_tokens: int = 16384
    """Most tokens generated per answer."""
    min_new_tokens: int = 0
    """End-of-answer tokens are suppressed until an answer has this many tokens."""
    max_tokens: int = 32768
    """Prompt + answer length limit."""
    greedy: bool = False
    """Greedy decoding (argmax); temperature, top_p and top_k are then not used."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest token set with this much probability (1 = off)."""
    top_k: int = 100000000
    """Sample from the k most likely tokens (0, or at least the vocabulary size, = off)."""
    temperature: float = 1.0
    """Sampling temperature (the logits are divided by it)."""
    stop_token_ids: List[int] = field(default_factory=list)
    """Extra token ids that end an answer (EOS and pad always do)."""

    def check(self, key: str) -> list[str]:
        p = [x for name in ("n_samples", "max_new_tokens", "max_tokens")
             for x in at_least_one(f"{key}.{name}", getattr(self, name))]
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            p.append(f"{key}.min_new_tokens: got {self.min_new_tokens}; must be in [0, max_new_tokens={self.max_new_tokens}].")
        if not 0 < self.top_p <= 1:
            p.append(f"{key}.top_p: got {self.top_p}; must be in (0, 1].")
        if self.top_k < 0:
            p.append(f"{key}.top_k: got {self.top_k}; must be >= 0.")
        if not self.greedy and (not is_number(self.temperature) or not self.temperature > 0):
            p.append(f"{key}.temperature: got {self.temperature!r}; must be > 0 (or set {key}.greedy=true).")
        return p


@dataclass
class DatasetConfig(Checked):
    """A prompt dataset: ``builtin:arith`` (generated offline), a HF hub id, or a local jsonl/parquet file."""

    path: str = "builtin:arith"
    """``builtin:arith``, a HF hub dataset id, or a local ``.jsonl``/``.json``/``.parquet``/``.csv`` file."""
    name: Optional[str] = None
    """HF dataset config name (``main`` for openai/gsm8k)."""
    split: str = "train"
    """Split to load from a HF dataset (``builtin:arith`` has ``train`` and ``test``); a local file is one split."""
    type: str = "rl"
    """AReaL's dataset type; only ``rl`` (prompts with reference answers) is supported."""
    batch_size: int = 8
    """Prompts per step (each sampled gconfig.n_samples times)."""
    shuffle: bool = True
    """Training prompts come in a new seeded order every epoch (false: file order)."""
    drop_last: bool = True
    """An epoch uses only whole batches, leaving out the remainder of the prompts (false: every prompt is
    used and the last batch is completed from the next epoch)."""
    max_length: Optional[int] = None
    """Drop prompts whose user message (the question in ``prompt_template``, then ``prompt_suffix``) is longer
    than this many tokens."""
    max_rows: Optional[int] = None
    """Use at most this many rows (for builtin:arith: how many problems to generate)."""
    question_key: str = "question"
    """Field of a row that holds the question (the prompt)."""
    answer_key: str = "answer"
    """Field of a row that holds the reference answer given to the reward function."""
    system_prompt: Optional[str] = None
    """System message before every question, rendered by the tokenizer's chat template (null: none;
    valid_dataset: null = train_dataset's, '' = none). It takes no placeholders: write literal braces as
    ``{{`` and ``}}``. A tokenizer whose chat template has no system role is reported when the data is built."""
    prompt_template: Optional[str] = None
    """The user message, with ``{question}`` where the row's question goes (null: ``{question}``, the
    question alone; valid_dataset: null = train_dataset's). Literal braces are written ``{{`` and ``}}``."""
    prompt_suffix: Optional[str] = None
    """The answer-format instruction, appended verbatim to the user message (null: the task's own, nothing for
    builtin:arith, whose warm start teaches ``#### n``, and ``\\nPlease put your final answer within
    \\boxed{}.`` for other data; valid_dataset: null = train_dataset's; '' = none)."""

    def check(self, key: str) -> list[str]:
        if self.type == "sft":
            p = [f"{key}.type: 'sft' datasets (supervised fine-tuning) are not supported here; the trainer does RL "
                 "on prompts (type 'rl'). Its supervised warm start is configured under sft_warmup."]
        else:
            p = one_of(f"{key}.type", self.type, ("rl",))
        p += at_least_one(f"{key}.batch_size", self.batch_size)
        for name in ("max_length", "max_rows"):
            p += at_least_one(f"{key}.{name}", getattr(self, name), nullable=True)
        return p + self.prompt_problems(key)

    def prompt_problems(self, key: str) -> list[str]:
        """Problems of ``system_prompt`` and ``prompt_template`` (only ``{question}``, in the template)."""
        p = []
        if isinstance(self.prompt_template, str):
            t = self.prompt_template
            fields, err = _placeholders(t)
            if err:
                p.append(f"{key}.prompt_template: got {t!r}, which is not a valid template ({err}); write literal "
                         "braces doubled ({{ and }}) and the placeholder as {question}.")
            elif "question" not in fields:
                p.append(f"{key}.prompt_template: got {t!r}, which has no {{question}} placeholder, so the prompt "
                         f"would not contain the question. Put {{question}} where the question goes, e.g. "
                         f"{key}.prompt_template='Question: {{question}}'.")
            unknown = [f for f in fields if f != "question"]
            if unknown:
                p.append(f"{key}.prompt_template: got {t!r}, with the unknown placeholder{'s' * (len(unknown) > 1)} "
                         f"{', '.join('{' + f + '}' for f in unknown)}; only {{question}} is filled in. Write literal "
                         f"braces doubled ({{{{ and }}}}, e.g. \\boxed{{{{}}}}), or put such text in {key}.prompt_suffix, "
                         "which is used verbatim.")
        if isinstance(self.system_prompt, str):
            s = self.system_prompt
            fields, err = _placeholders(s)
            if err:
                p.append(f"{key}.system_prompt: got {s!r}, which is not valid ({err}); write literal braces "
                         "doubled ({{ and }}).")
            elif fields:
                p.append(f"{key}.system_prompt: got {s!r}, with the placeholder{'s' * (len(fields) > 1)} "
                         f"{', '.join('{' + f + '}' for f in fields)}; the system prompt takes no placeholders (the "
                         f"question goes in {key}.prompt_template). Write literal braces doubled ({{{{ and }}}}).")
        return p

    def inherit_prompts(self, other: "DatasetConfig") -> None:
        """Set this config's null prompt keys to ``other``'s (valid_dataset asks as train_dataset does)."""
        for name in PROMPT_KEYS:
            if getattr(self, name) is None:
                setattr(self, name, getattr(other, name))


PROMPT_KEYS = ("system_prompt", "prompt_template", "prompt_suffix")
"""The keys of ``DatasetConfig`` that shape the prompt; valid_dataset takes train_dataset's where null."""


def _placeholders(text: str) -> tuple[list[str], str]:
    """The placeholders of a ``str.format`` template as written (``question``, ``foo!r``), and the parse
    error ("" if none); ``{{``/``}}`` are literal braces."""
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as e:
        return [], str(e)
    fields = [name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
              for _, name, spec, conv in parts if name is not None]
    return fields, ""


@dataclass
class RolloutConfig(Checked):
    """How trajectories are produced: the inference backend, the workflow, and group filtering."""

    backend: str = "hf"
    """``hf`` (transformers generate, works everywhere) or ``vllm`` (optional extra; colocated engine)."""
    vllm_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``enforce_eager``)."""
    workflow: str = "areal_trainer.rollout.workflow.RLVRWorkflow"
    """Import path of the workflow class that turns one prompt into trajectories."""
    workflow_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the workflow class (e.g. ``max_turns`` of the multi-turn workflow)."""
    dynamic_filter: Optional[str] = None
    """Import path of ``fn(group) -> bool`` deciding whether a prompt's group is trained on
    (``areal_trainer.rollout.filters.has_reward_variance`` is DAPO's dynamic sampling)."""
    max_sampling_rounds: int = 8
    """With a filter and a fixed batch size: give up (with an error) after this many rounds of sampling."""
    generation_batch_size: Optional[int] = None
    """Sequences per generate call (null: the whole step at once)."""
    # -- asynchronous, off-policy training (AReaL's names and defaults) ----------------------------
    max_head_offpolicyness: int = 0
    """eta: the most policy versions a trained token may lag behind the policy being trained. 0 =
    synchronous (generate, then train); > 0 = generation runs ahead of training (``offpolicy_mode``)."""
    offpolicy_mode: str = "concurrent"
    """How eta > 0 produces off-policy data. ``concurrent``: a rollout thread generates on its own copy of
    the policy while the trainer trains, admission bounded by AReaL's staleness manager. ``lagged``:
    reproducible, no concurrency; each prompt group is sampled by a policy snapshot lagging a seeded
    number of versions in [0, eta]."""
    lagged_switch_prob: float = 0.0
    """``lagged`` only: probability that a generation switches to a newer snapshot after a seeded number
    of tokens, as when a weight update lands mid-generation (its unfinished answers carry two versions)."""
    consumer_batch_size: Optional[int] = None
    """Prompt groups the trainer consumes per version, the staleness manager's unit (null: train_dataset.batch_size,
    the only value that keeps the bound exact)."""
    max_concurrent_rollouts: Optional[int] = None
    """Most prompt groups generating at once, i.e. per generation call (null: consumer_batch_size)."""
    queue_size: Optional[int] = None
    """Most prompt groups generated or generating but not yet trained on (null: 16 x max_concurrent_rollouts)."""
    partial_rollout: bool = True
    """On a weight update, interrupt the generation in flight at a token boundary and continue it under the
    new weights (each token keeps the version that sampled it); false: the update waits for it to finish."""
    dtype: Optional[str] = None
    """Precision of the rollout's copy of the policy (null: the trainer's own weights and precision).
    ``bfloat16`` under float32 training gives the train/inference mismatch of bf16 inference engines."""
    request_timeout: float = 3600.0
    """Seconds the trainer waits for the rollout thread to finish a generation call before stopping the run."""

    def check(self, key: str) -> list[str]:
        p = one_of(f"{key}.backend", self.backend, ("hf", "vllm"))
        p += one_of(f"{key}.offpolicy_mode", self.offpolicy_mode, ("concurrent", "lagged"))
        p += one_of(f"{key}.dtype", self.dtype, (None, "float32", "bfloat16", "float16"))
        p += at_least_one(f"{key}.max_sampling_rounds", self.max_sampling_rounds)
        if self.max_head_offpolicyness < 0:
            p.append(f"{key}.max_head_offpolicyness: got {self.max_head_offpolicyness}; must be >= 0 "
                     "(0 = synchronous; AReaL's GSM8K examples use 2).")
        for name in ("consumer_batch_size", "max_concurrent_rollouts", "queue_size"):
            p += at_least_one(f"{key}.{name}", getattr(self, name), nullable=True)
        p += fraction(f"{key}.lagged_switch_prob", self.lagged_switch_prob)
        if not self.request_timeout > 0:
            p.append(f"{key}.request_timeout: got {self.request_timeout}; must be > 0 seconds.")
        return p


@dataclass
class RewardConfig(Checked):
    """The reward function ``fn(prompt, completion, answer, **kwargs) -> float``, by import path."""

    fn: str = "areal_trainer.reward.math.gsm8k_reward_fn"
    """Import path of the reward function."""
    kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to the reward function on every call."""
    error_value: float = 0.0
    """Reward given to a sample whose reward function raised."""
    max_error_fraction: float = 0.5
    """Stop the run when more than this fraction of one batch's rewards raised."""

    def check(self, key: str) -> list[str]:
        p = []
        if not isinstance(self.fn, str) or "." not in self.fn:
            p.append(f"{key}.fn: got {self.fn!r}; give an import path 'package.module.function'.")
        p += fraction(f"{key}.max_error_fraction", self.max_error_fraction)
        return p


@dataclass
class _Freq(Checked):
    freq_epochs: Optional[int] = None
    """At the end of every this many epochs (null: not by epochs)."""
    freq_steps: Optional[int] = None
    """After every this many training steps (null: not by steps)."""
    freq_secs: Optional[float] = None
    """After a step, when at least this many seconds have passed since the last time (null: not by time)."""

    def check(self, key: str) -> list[str]:
        return [f"{key}.{n}: got {getattr(self, n)}; must be > 0 or null."
                for n in ("freq_epochs", "freq_steps", "freq_secs")
                if getattr(self, n) is not None and not getattr(self, n) > 0]


@dataclass
class SaverConfig(_Freq):
    """Checkpoints (weights, optimizer, LR schedule, data position, RNG), written atomically."""

    keep_last: int = 2
    """Keep only this many newest checkpoints (older ones are deleted after a new one is complete)."""


@dataclass
class EvaluatorConfig(_Freq):
    """Held-out evaluation on ``valid_dataset`` with ``eval_gconfig``."""

    eval_before_train: bool = False
    """Also evaluate once before the first training step (the run always evaluates after the last one)."""


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
    """Weights & Biases logging of the metrics (``wandb.init`` settings); the run is named <experiment_name>/<trial_name>."""

    mode: str = "offline"
    """``offline`` (default; never touches the network), ``online``, or ``disabled``."""
    project: str = "areal_trainer"
    """W&B project of the runs."""
    entity: Optional[str] = None
    """W&B user or team (null: the default entity of the login)."""
    tags: List[str] = field(default_factory=list)
    """Tags of the W&B run."""

    def check(self, key: str) -> list[str]:
        return one_of(f"{key}.mode", self.mode, ("offline", "online", "disabled"))


@dataclass
class StatsLoggerConfig(Checked):
    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress_bar: bool = True
    plot: bool = True
    """Write ``curves.png`` (reward and held-out accuracy) into the run directory at the end."""
    samples_per_step: int = 4
    """Sampled trajectories appended to ``samples.jsonl`` (and a wandb table) each step, 0 disables:
    the first answer of each prompt group in batch order, then the second answers, ... (no randomness).
    Each record holds the prompt and completion text, the reward, the advantage (the mean over the
    row's loss tokens), the answer length and the policy versions of the sampled tokens."""

    def check(self, key: str) -> list[str]:
        v = self.samples_per_step
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return [f"{key}.samples_per_step: got {v!r}; must be an integer >= 0 (0 writes no samples.jsonl)."]
        return []


@dataclass
class SchedulerConfig(Checked):
    """Where the training processes run (AReaL's ``scheduler.type``); see ``areal_trainer/launch/``."""

    type: Optional[str] = None
    """null: in this process (or the processes ``accelerate launch`` / ``torchrun`` started). ``local``:
    ``cluster.n_gpus_per_node`` processes on this machine. ``ray``: one process per GPU (``cluster.n_nodes``
    x ``cluster.n_gpus_per_node``) on a Ray cluster. ``slurm``: a Slurm job of ``cluster.n_nodes`` nodes."""
    ray_address: str = "auto"
    """``ray``: the cluster to join: ``auto`` (``RAY_ADDRESS``, else a head on this machine), ``host:port``
    or ``ray://host:port``."""
    slurm_partition: Optional[str] = None
    """``slurm``: the partition (null: the cluster's default)."""
    slurm_account: Optional[str] = None
    """``slurm``: the account charged for the job (null: the user's default)."""
    slurm_time_min: int = 240
    """``slurm``: the job's time limit in minutes."""
    slurm_sbatch_args: Dict[str, Any] = field(default_factory=dict)
    """``slurm``: further ``#SBATCH`` options, e.g. ``{qos: high, constraint: h100}``."""
    slurm_executor: str = "slurm"
    """``slurm`` submits with ``sbatch``; ``local`` runs the same job through submitit's local executor on
    this machine (to try a Slurm setup without Slurm)."""
    slurm_wait: bool = False
    """``slurm``: wait for the job to end and exit with its status (default: print the job id and return)."""

    def check(self, key: str) -> list[str]:
        p = one_of(f"{key}.type", self.type, (None, "local", "ray", "slurm"))
        p += one_of(f"{key}.slurm_executor", self.slurm_executor, ("slurm", "local"))
        p += at_least_one(f"{key}.slurm_time_min", self.slurm_time_min)
        return p + _json_problems(f"{key}.slurm_sbatch_args", self.slurm_sbatch_args)


@dataclass
class NameResolveConfig(Checked):
    """AReaL's service discovery settings; processes here meet through torch's rendezvous instead."""

    type: str = "nfs"
    """AReaL's name-resolve backend; not used here."""
    nfs_record_root: str = "/tmp/areal/name_resolve"
    """AReaL's ``nfs`` backend directory; not used here."""
    etcd3_addr: str = "localhost:2379"
    """AReaL's ``etcd3`` backend address; not used here."""
    ray_actor_name: str = "ray_kv_store"
    """AReaL's ``ray`` backend actor; not used here."""


@dataclass
class ClusterConfig(Checked):
    """The machines of a run (AReaL's ``cluster``)."""

    fileroot: str = "outputs"
    """Run directories are <fileroot>/<experiment_name>/<trial_name>."""
    n_nodes: int = 1
    """Nodes for ``scheduler.type=ray`` or ``slurm`` (``local`` is one node)."""
    n_gpus_per_node: Optional[int] = None
    """Training processes per node, one per GPU (null: the GPUs visible here; 1 process on a machine
    without a GPU, where any number of processes can share the CPU over gloo)."""
    cluster_name: str = "local"
    """A label in AReaL; not used here."""
    name_resolve: NameResolveConfig = field(default_factory=NameResolveConfig)

    def check(self, key: str) -> list[str]:
        return at_least_one(f"{key}.n_nodes", self.n_nodes) + at_least_one(
            f"{key}.n_gpus_per_node", self.n_gpus_per_node, nullable=True)


@dataclass
class SFTWarmupConfig(Checked):
    """Supervised warm start on the training set's reference answers, run before RL."""

    steps: Optional[int] = None
    """null = only for built-in (randomly initialised) models; 0 disables."""
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
        if self.steps is not None and self.steps < 0:
            return [f"{key}.steps: got {self.steps}; must be >= 0 or null."]
        return []


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
    """Stop after this many training steps if that comes before ``total_train_epochs`` (null: no step limit)."""
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
    """The held-out prompts of the evaluation (null: no evaluation, so ``evaluator`` must not schedule any)."""
    actor: PPOActorConfig = field(default_factory=PPOActorConfig)
    ref: Optional[PPOActorConfig] = None
    """The frozen reference policy of the KL penalty, needed when ``actor.kl_ctl > 0``. Only ``path`` and
    ``dtype`` are read (the same path as ``actor.path``: a copy of the policy as RL starts)."""
    critic: Optional[PPOCriticConfig] = None
    """The value model of PPO's GAE (null: no critic, as in GRPO)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sft_warmup: SFTWarmupConfig = field(default_factory=SFTWarmupConfig)
    saver: SaverConfig = field(default_factory=SaverConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    recover: RecoverConfig = field(default_factory=RecoverConfig)
    stats_logger: StatsLoggerConfig = field(default_factory=StatsLoggerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        # Evaluation asks its questions as training does unless valid_dataset sets its own prompt keys
        # (inherited only from valid ones, so that a bad key is reported once, under train_dataset).
        t, v = self.train_dataset, self.valid_dataset
        if isinstance(t, DatasetConfig) and isinstance(v, DatasetConfig) and not t.prompt_problems("train_dataset"):
            v.inherit_prompts(t)
        super().__post_init__()

    def check(self, key: str) -> list[str]:
        p = []
        p += at_least_one("total_train_epochs", self.total_train_epochs)
        p += at_least_one("total_train_steps", self.total_train_steps, nullable=True)
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            p.append(f"device: got {self.device!r}; use auto, cpu, cuda or cuda:<index>.")
        return p


def is_finite_number(x: Any) -> bool:
    return is_number(x) and math.isfinite(x)
