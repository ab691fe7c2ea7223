"""What a resume may change: every key of the schema is *safe* (the new value applies from the resumed
step on) or *refused* (the checkpoint was trained for other settings; continuing would silently train
something else). One table, by key prefix; the longest prefix that matches a key decides.

A checkpoint records the settings it was trained with (``checkpoints/step_<N>/settings.json``);
``compare`` lists the keys whose values differ, each with its verdict and why. ``tests/config/
test_resume_rules.py`` checks that every key of the schema is covered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SAFE: dict[str, str] = {
    "total_train_steps": "the run's length (the LR schedule follows the new length)",
    "total_train_epochs": "the run's length (the LR schedule follows the new length)",
    "actor.optimizer": "the learning rate, its schedule and the optimizer's settings (set on the restored optimizer)",
    "critic.optimizer": "the critic's learning rate, schedule and optimizer settings",
    "actor.max_consecutive_nonfinite_steps": "when the run stops on non-finite updates",
    "actor.gradient_checkpointing": "memory against compute; the same gradients",
    "actor.mb_spec": "how a batch is cut into micro-batches for memory",
    "critic.gradient_checkpointing": "memory against compute",
    "critic.mb_spec": "how a batch is cut into micro-batches for memory",
    "saver": "when checkpoints are written and how many are kept",
    "recover": "when recovery checkpoints are written",
    "evaluator": "when the held-out evaluation runs",
    "valid_dataset": "the held-out evaluation, which does not train",
    "eval_gconfig": "how the held-out evaluation samples",
    "stats_logger": "what is logged and shown",
    "sft_warmup": "the warm start, which ran before the first step",
    "experiment_name": "names only",
    "trial_name": "names only",
    "cluster.fileroot": "where runs are kept",
    "cluster.cluster_name": "names only",
    "cluster.name_resolve": "how processes find each other",
    "device": "where the same computation runs",
    "allow_builtin_model_on_any_data": "a start-up check",
    "scheduler": "where the processes run",
    "rollout.request_timeout": "how long a stalled rollout may take before the run stops",
    "rollout.vllm_kwargs": "the vLLM engine's memory and scheduling settings",
    "rollout.server_addrs": "which servers sample (they receive the checkpoint's weights first)",
    "rollout.setup_timeout": "how long the run waits for its inference servers",
    "rollout.request_retries": "how often a failed request to a server is retried",
    "actor.weight_update_timeout": "how long a weight update to the servers may take",
    "actor.weight_update_dir": "where disk weight updates are written",
    "actor.weight_update_mode": "how the same weights reach the servers",
    "rollout.agent_timeout": "how long one agent episode may take",
    "reward.workers": "how many processes run the same reward function",
    "reward.timeout": "how long one reward call may take",
    "reward.max_error_fraction": "when failing reward calls stop the run",
    "reward.url_timeout": "how the scoring service is called",
    "reward.url_retries": "how the scoring service is called",
    "reward.url_max_concurrent": "how the scoring service is called",
    "reward.url_batch_size": "how the scoring service is called",
    "reward.model.micro_batch_size": "how the reward model's batches are cut",
    "teacher.mb_spec": "how the teacher's forward is cut into micro-batches for memory",
    "teacher.device": "where the same teacher runs",
    "teacher.shard": "how the same teacher is laid out over the FSDP2 processes",
    "environment.eval_split": "the held-out evaluation, which does not train",
    "environment.eval_size": "the held-out evaluation, which does not train",
    "environment.eval_seed": "the held-out evaluation, which does not train",
}
"""Keys a resume may change: the new value is used from the resumed step on."""

REFUSED: dict[str, str] = {
    "algorithm": "the algorithm",
    "seed": "the random streams: the data order and the sampling",
    "actor": "the policy model or its training algorithm",
    "critic": "the critic",
    "ref": "the reference policy",
    "teacher": "the teacher or the distillation objective (the checkpoint holds no teacher: its path and settings "
               "decide what the resumed run distils from)",
    "gconfig": "how answers are sampled (group size, length, temperature)",
    "train_dataset": "the training data and its order, or the batch size",
    "tokenizer_path": "the tokenizer",
    "reward": "the reward",
    "environment": "the environment: its tasks, their order, its episodes and its scoring",
    "rollout": "how answers are generated and which are trained on",
    "dynamic_bs": "the batches trained on",
    "parallel": "how the model is split across processes",
    "cluster": "the processes' layout",
    "cluster.n_nodes": "the number of processes, which splits the data",
    "cluster.n_gpus_per_node": "the number of processes, which splits the data",
    "scheduler.type": "the number of processes, which splits the data",
}
"""Keys a resume may not change: the checkpoint was trained for their values."""


NOT_COMPARED = ("recover.mode",)
"""Keys that differ on every resume by design (a first start has ``recover.mode`` off, its resume on)."""


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any
    safe: bool
    why: str

    def line(self) -> str:
        return f"{self.key}: {_shown(self.old)} -> {_shown(self.new)} ({self.why})"


def _shown(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def rule(key: str) -> tuple[bool, str]:
    """``(safe, why)`` for a dotted key: the longest matching prefix of either table decides."""
    best, verdict = -1, (False, "not classified: refused to be safe")
    for table, safe in ((SAFE, True), (REFUSED, False)):
        for prefix, why in table.items():
            if (key == prefix or key.startswith(prefix + ".")) and len(prefix) > best:
                best, verdict = len(prefix), (safe, why)
    return verdict


def flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as ``{dotted key: leaf value}`` (a section that is null is one leaf)."""
    out: dict[str, Any] = {}
    for k, v in settings.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def compare(old: Mapping[str, Any], new: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> list[Change]:
    """Every key whose value differs between two settings (nested dicts), with its verdict. A key the old settings
    lack (it came with a later release) is no change when the new value is its schema default (``defaults``, the
    settings of a default configuration): a new key's default keeps the behaviour the old run had."""
    a, b = flatten(old), flatten(new)
    d = flatten(defaults or {})
    changes = []
    for key in sorted((set(a) | set(b)) - set(NOT_COMPARED)):
        if key not in a and key in d and b.get(key, _MISSING) == d[key]:
            continue
        if a.get(key, _MISSING) != b.get(key, _MISSING):
            safe, why = rule(key)
            changes.append(Change(key, a.get(key), b.get(key), safe, why))
    return changes


_MISSING = object()
