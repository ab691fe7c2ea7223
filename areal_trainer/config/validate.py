"""Validation of a whole ``TrainerConfig``: every section's own rules (once each, in schema order) plus
the rules that span sections. Returns all problems at once and loads no model; only the rules of
rejection sampling, which are the loss's, import torch (``collect(cfg, light=True)`` leaves them out).
The rules of components (plugins, the loss, the advantage stages, the rollout engine) are checked
where those are bound, in ``components/``, in the same round.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from .areal_keys import duplicate_key_warnings
from .base import Checked
from .compat import compat_warnings
from .keys import sections
from .pitfalls import useless_run_problems
from .schema import TrainerConfig
from .servers import server_problems


def collect(cfg: TrainerConfig, *, light: bool = False) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the whole config. ``light``: without the sections whose rules are the maths'
    (``Checked.imports_torch``: rejection sampling), so that nothing imports torch."""
    problems: list[str] = []
    warns: list[str] = []
    for key, node in sections(cfg):
        if isinstance(node, Checked):
            if not (light and node.imports_torch):
                problems += node.check(key)
            warns += node.warnings(key)
    p, w = _cross_section(cfg)
    return problems + p, warns + w + compat_warnings(cfg)


def _cross_section(cfg: TrainerConfig) -> tuple[list[str], list[str]]:
    p: list[str] = []
    w: list[str] = []
    a = cfg.actor
    if a.kl_ctl > 0 and cfg.ref is None:
        p.append(f"actor.kl_ctl={a.kl_ctl} needs a reference model, but there is no `ref` section: add one "
                 "(e.g. `+ref.path=${actor.path} +ref.optimizer=null`) or set actor.kl_ctl=0.")
    rows = cfg.train_dataset.batch_size * cfg.gconfig.n_samples
    if isinstance(a.ppo_n_minibatches, int) and a.ppo_n_minibatches > rows:
        p.append(f"actor.ppo_n_minibatches={a.ppo_n_minibatches} exceeds the rows per step "
                 f"(train_dataset.batch_size*gconfig.n_samples={rows}); lower it or raise the batch.")
    if cfg.critic is not None and isinstance(cfg.critic.ppo_n_minibatches, int) and cfg.critic.ppo_n_minibatches > rows:
        p.append(f"critic.ppo_n_minibatches={cfg.critic.ppo_n_minibatches} exceeds the rows per step ({rows}).")
    p_useless, w_useless = useless_run_problems(cfg)
    p, w = p + p_useless, w + w_useless + duplicate_key_warnings(cfg)
    for key, path in _local_paths(cfg):
        full = os.path.expanduser(path)
        if not os.path.exists(full):
            p.append(f"{key}: {path!r} does not exist (no such file or directory).")
        elif key in _MODEL_KEYS or key.startswith("teacher."):
            p += _not_a_model(key, path, full)
    p += _rollout_problems(cfg) + _scheduler_problems(cfg) + server_problems(cfg)
    if cfg.dynamic_bs and cfg.rollout.dynamic_filter is None:
        w.append("dynamic_bs=true without rollout.dynamic_filter: every group is accepted, the batch is fixed.")
    return p, w


def _rollout_problems(cfg: TrainerConfig) -> list[str]:
    """Asynchronous-rollout settings that cannot work together."""
    r, b = cfg.rollout, cfg.train_dataset.batch_size
    p = []
    if r.consumer_batch_size is not None and r.consumer_batch_size != b:
        p.append(f"rollout.consumer_batch_size={r.consumer_batch_size} differs from train_dataset.batch_size={b}: the "
                 "staleness manager counts the groups the trainer consumes per version, so a smaller value stalls "
                 "the run and a larger one breaks the staleness bound. Leave it null (or set it to the batch size).")
    concurrent = r.max_concurrent_rollouts or b
    queue = r.queue_size or 16 * concurrent
    if queue < b:
        p.append(f"rollout.queue_size={queue} is smaller than one batch (train_dataset.batch_size={b} prompt groups): "
                 "the trainer could never collect a batch. Raise it to at least the batch size, or leave it null.")
    return p


def _scheduler_problems(cfg: TrainerConfig) -> list[str]:
    """Launch settings that cannot work, before anything starts."""
    s, c = cfg.scheduler, cfg.cluster
    p = []
    if s.type == "local" and c.n_nodes > 1:
        p.append(f"cluster.n_nodes={c.n_nodes} with scheduler.type=local: local runs on this machine only. Set "
                 "cluster.n_nodes=1, or use scheduler.type=slurm or scheduler.type=ray for several nodes.")
    if s.type == "ray" and importlib.util.find_spec("ray") is None:
        p.append("scheduler.type=ray needs the 'ray' package: pip install -e '.[ray]' (or pip install ray).")
    if s.type == "slurm" and s.slurm_executor == "slurm" and shutil.which("sbatch") is None:
        p.append("scheduler.type=slurm: there is no `sbatch` here. Run on a Slurm login node, or set "
                 "scheduler.slurm_executor=local to run the job through submitit's local executor.")
    if s.type == "slurm" and s.slurm_executor == "local" and c.n_nodes > 1:
        p.append(f"cluster.n_nodes={c.n_nodes} with scheduler.slurm_executor=local: the local executor runs on this "
                 "machine only; set cluster.n_nodes=1.")
    if s.type == "slurm" and importlib.util.find_spec("submitit") is None:
        p.append("scheduler.type=slurm needs the 'submitit' package: pip install -e '.[slurm]'.")
    return p


_MODEL_KEYS = ("actor.path", "ref.path", "critic.path")


def _not_a_model(key: str, path: str, full: str) -> list[str]:
    """A model path that is an empty directory: named as such before anything loads (a checkpoint directory
    of this trainer holds its model in ``actor/``; a Hugging Face one ``config.json``; either is left to the
    loader)."""
    if not os.path.isdir(full) or os.listdir(full):
        return []
    return [f"{key}: {path!r} is an empty directory. Give a checkpoint directory (this trainer's "
            "outputs/<experiment>/<trial>/checkpoints/step_<N>, or a Hugging Face one with config.json and "
            "weights), a model id, or builtin:tiny."]


def _local_paths(cfg: TrainerConfig) -> list[tuple[str, str]]:
    """Paths in the config that are clearly local (``./x``, ``/x``, ``~/x``), to check they exist."""
    found = [("actor.path", cfg.actor.path), ("tokenizer_path", cfg.tokenizer_path),
             ("train_dataset.path", cfg.train_dataset.path)]
    for name in ("ref", "critic", "valid_dataset"):
        section = getattr(cfg, name)
        if section is not None:
            found.append((f"{name}.path", section.path))
    if cfg.teacher is not None:
        found += cfg.teacher.model_paths()
    return [(k, v) for k, v in found if isinstance(v, str) and v.startswith((".", "/", "~"))]
