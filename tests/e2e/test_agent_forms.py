"""One agent, two forms, through the real command line: the same ``openai``-package calculator agent with the
trainer's client and over the HTTP endpoint with its own ``openai.AsyncOpenAI`` (on the trainer's event loop and
in two agent processes, ``rollout.agent_processes=2``), in the lagged mode with
one seed and held-out evaluation on, logs the same metrics at every step (timings aside): the rows trained,
their rewards, the losses, the counters and the held-out results. The tool-calling built-in model's warm
start (shared by both runs through the warm-start cache) makes its episodes call the tool and answer."""

import json
import os

from .helpers import cli

FORMS = {"in_process": ["rollout.agent=tests.agents.two_forms.run_client"],
         "http": ["rollout.agent=tests.agents.two_forms.HTTP"],
         "http_processes": ["rollout.agent=tests.agents.two_forms.HTTP", "rollout.agent_processes=2"]}
"""The in-process form, and the HTTP form on the trainer's loop and in two agent processes."""
COMMON = ["--config-name", "grpo", "actor.path=builtin:tiny-tools", "sft_warmup.steps=100", "sft_warmup.batch_size=16",
          "sft_warmup.lr=6e-3", "total_train_steps=3", "train_dataset.batch_size=2", "train_dataset.max_rows=256",
          "gconfig.n_samples=4", "gconfig.max_new_tokens=40", "rollout.agent_export=concat",
          "rollout.max_head_offpolicyness=1", "rollout.offpolicy_mode=lagged", "valid_dataset.max_rows=8",
          "valid_dataset.batch_size=8", "evaluator.freq_steps=2", "saver.freq_steps=null",
          "stats_logger.progress_bar=false", "stats_logger.plot=false"]
TIMING = ("time/", "perf/", "rollout/overlap_frac", "rollout/trainer_idle_frac", "rollout/generator_idle_frac",
          "sft/cached")


def _records(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in map(json.loads, f)]


def test_the_two_forms_of_one_agent_log_the_same_metrics_at_every_step(tmp_path):
    runs = {}
    for name, overrides in FORMS.items():
        cli([*COMMON, *overrides, f"trial_name={name}"], cwd=tmp_path, timeout=900,
            env={"AREAL_TRAINER_CACHE": str(tmp_path / "cache")})
        runs[name] = _records(tmp_path / "outputs" / "grpo" / name)
    restarts = [r.pop(k) for r in runs["http_processes"] for k in list(r) if k.endswith("agent/process_restarts")]
    assert restarts and set(restarts) == {0}
    local = runs["in_process"]
    for other in (runs["http"], runs["http_processes"]):
        assert [r["step"] for r in local] == [r["step"] for r in other]
        for a, b in zip(local, other):
            assert a == b, a["step"]
    steps = [r for r in local if "agent/calls" in r]
    evals = [r for r in local if "eval/agent/episodes" in r]
    assert [r["step"] for r in steps] == [1, 2, 3] and [r["step"] for r in evals] == [0, 2, 3]
    # The episodes called the tool (read from the answers, run by the agent itself) and saw its result.
    assert sum(r["agent/tool_calls"] for r in steps) > 0
    assert sum(r["agent/calls"] for r in steps) > sum(r["agent/episodes"] for r in steps)
