"""Settings that are each valid but together make a run silently useless (it would train on zeros
or score 0): one answer per prompt with group normalisation, a training set smaller than one batch,
the built-in model or tokenizer on real data, a teacher that cannot teach. Reported with the other
cross-section rules."""

from __future__ import annotations

from .schema import TrainerConfig


def useless_run_problems(cfg: TrainerConfig) -> tuple[list[str], list[str]]:
    """(problems, warnings)."""
    p, w = _singleton_group_problems(cfg)
    return p + _batch_problems(cfg) + _builtin_model_problems(cfg), w + _teacher_warnings(cfg)


def _teacher_warnings(cfg: TrainerConfig) -> list[str]:
    """Teachers that cannot teach: a built-in model by name is built untrained (random weights, no warm
    start), and the student's own starting model only pulls the student back to where it began."""
    if cfg.teacher is None:
        return []
    w = []
    for key, path in cfg.teacher.model_paths():
        if isinstance(path, str) and path.startswith("builtin:"):
            w.append(f"{key}={path!r} is the built-in model untrained (random weights, without the student's warm "
                     "start or any RL): distilling from it unlearns the task. Give a trained checkpoint as the "
                     f"teacher, e.g. {key}=outputs/<experiment>/<trial>/checkpoints/step_<N> of a run on the same "
                     "task.")
        elif path == cfg.actor.path:
            w.append(f"{key}={path!r} is the student's own starting model (actor.path): distilling from it only pulls "
                     f"the student back to where it began. Give a stronger model with the same tokenizer.")
    return w


def _singleton_group_problems(cfg: TrainerConfig) -> tuple[list[str], list[str]]:
    """Group normalisation with one answer per prompt: a group of one is its own mean, its std is taken as 1."""
    a, adv = cfg.actor, cfg.actor.advantage
    replaced = adv.compute is not None and adv.compute.implementation not in ("default", "auto")
    if cfg.gconfig.n_samples != 1 or replaced:
        return [], []  # several answers per prompt, or an advantage computation that may not use the norms
    if cfg.teacher is not None and cfg.teacher.pure:
        return [], []  # pure distillation computes no reward and no advantage: the norms never run
    own_baseline = adv.group_baseline is not None and adv.group_baseline.implementation != "auto"
    # Without a critic, KL term or discount, an answer's advantage is the same at every token: centring
    # it by its own mean (adv_norm at group level) leaves 0, as centring its reward (reward_norm) does.
    flat = cfg.critic is None and a.kl_ctl == 0 and a.discount == 1
    p, w = [], []
    for name, what in (("reward_norm", "reward"), ("adv_norm", "advantage")):
        norm = getattr(a, name)
        if norm is None or not norm.uses_group_statistics or (name == "reward_norm" and own_baseline):
            continue
        fix = f"actor.{name}.mean_level=batch" + (f" actor.{name}.std_level=batch" if norm.std_level == "group" else "")
        if norm.mean_level == "group" and (name == "reward_norm" or flat):
            tail = ("zero advantage after group normalisation, zero loss and zero gradient at every step; the run "
                    "would learn nothing" if flat else "the task reward never reaches the advantage")
            p.append(f"gconfig.n_samples=1 with actor.{name}.mean_level=group: a group of one answer is centred by "
                     f"its own {what}, so every {what} becomes 0 — {tail}. Set gconfig.n_samples>=2 (e.g. "
                     "gconfig.n_samples=4), use a preset without group statistics (--config-name ppo), or normalise "
                     f"over the batch ({fix}).")
        elif norm.mean_level == "group":
            w.append(f"gconfig.n_samples=1 with actor.{name}.mean_level=group: each answer's advantages are centred "
                     "by their own mean, which removes the answer's overall advantage; set gconfig.n_samples>=2 "
                     f"or {fix}.")
        else:
            w.append(f"gconfig.n_samples=1 with actor.{name}.std_level=group: the std of a group of one answer is "
                     f"taken as 1, so the group scaling does nothing; set gconfig.n_samples>=2 or {fix}.")
    return p, w


def _batch_problems(cfg: TrainerConfig) -> list[str]:
    """A training set capped below one batch (the rows actually loaded are checked by data/datasets.py)."""
    d = cfg.train_dataset
    capped = isinstance(d.max_rows, int) and isinstance(d.batch_size, int) and 1 <= d.max_rows < d.batch_size
    if not (d.drop_last and capped):
        return []
    return [f"train_dataset.batch_size={d.batch_size} is more than train_dataset.max_rows={d.max_rows} rows of "
            f"{d.path!r}: not one whole batch can be formed (drop_last=true), so there would be no training step. "
            f"Set train_dataset.batch_size={d.max_rows} or less, or raise train_dataset.max_rows."]


def _builtin_model_problems(cfg: TrainerConfig) -> list[str]:
    """The built-in model or tokenizer knows only the built-in task's words; other data becomes ``<unk>``."""
    data = [(k, d.path) for k, d in (("train_dataset", cfg.train_dataset), ("valid_dataset", cfg.valid_dataset))
            if d is not None and not str(d.path).startswith("builtin:")]
    if cfg.allow_builtin_model_on_any_data or not data:
        return []
    model = str(cfg.actor.path).startswith("builtin:")
    tokenizer = str(cfg.tokenizer_path).startswith("builtin:") or (cfg.tokenizer_path is None and model)
    if not (model or tokenizer):
        return []
    on = " and ".join(f"{k}.path={v!r}" for k, v in data) + (" are" if len(data) > 1 else " is")
    fixes = ["actor.path to a pretrained model (e.g. actor.path=HuggingFaceTB/SmolLM2-135M-Instruct, "
             "actor.path=smollm2 for the packaged offline copy, or a local Hugging Face model "
             "directory)"] if model else []
    if tokenizer and cfg.tokenizer_path is not None:
        fixes.append("tokenizer_path=null (the tokenizer of actor.path)")
    fix = (f"Set {' and '.join(fixes)}, or set allow_builtin_model_on_any_data=true to run it anyway "
           "(e.g. to test the plumbing).")
    if tokenizer:
        what = (f"tokenizer_path={cfg.tokenizer_path!r} is the built-in word-level tokenizer, which"
                if cfg.tokenizer_path is not None else
                f"actor.path={cfg.actor.path!r} is the built-in model, whose word-level tokenizer")
        return [f"{what} knows only the words of the built-in task (builtin:arith), but {on} other data: most "
                f"of its words would become <unk> and the run would score 0. {fix}"]
    return [f"actor.path={cfg.actor.path!r} is a small randomly initialised model made for the built-in task "
            f"(builtin:arith), but {on} other data: with no language knowledge the run would score 0. {fix}"]
