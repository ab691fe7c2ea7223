"""Synchronous against asynchronous training, side by side in one run: the real command line with
``rollout.max_head_offpolicyness`` = 0 (synchronous), 1, 2 and 4, each in a fresh process on the same
workload, and per setting

* steps/s over the measured steps (after ``--warmup`` steps), and the ratio to the synchronous run;
* the fraction of wall time in which generation and training overlap, and each side's idle share
  (synchronous: the trainer idles while generating and the generator while training);
* the staleness distribution of the trained tokens (share of tokens 0, 1, 2, ... versions old).

Every setting runs the same steps: the built-in task's GRPO with its cached warm start (the first
setting pays for it once), no evaluation and no checkpoints. On a machine where generation and
training share the same cores (2 here) they compete for them: an overlap only pays where one side
leaves the cores idle (the Python overhead of a step, waiting on the other side); this benchmark
reports what it measures.

    python scripts/bench_async.py [--steps 12] [--warmup 2] [--etas 0,1,2,4] [--model builtin:tiny] [-- overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_setting(eta: int, args, tmp: str) -> dict:
    run_dir = os.path.join(tmp, f"eta{eta}")
    total = args.warmup + args.steps
    overrides = ["--config-name", "grpo", f"rollout.max_head_offpolicyness={eta}", f"total_train_steps={total}",
                 f"actor.path={args.model}", "valid_dataset=null", "evaluator.freq_steps=null",
                 "evaluator.eval_before_train=false", "saver.freq_steps=null", "stats_logger.progress_bar=false",
                 "stats_logger.plot=false", f"hydra.run.dir={run_dir}", *args.overrides]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "areal_trainer", *overrides], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"eta={eta} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if "time/step" in r]
    measured = steps[args.warmup:]
    wall = sum(r["time/step"] for r in measured)
    out = {"eta": eta, "steps_per_s": len(measured) / wall, "wall": wall, "process_s": time.time() - t0,
           "step_s": wall / len(measured)}
    if eta == 0:
        gen = sum(r["time/rollout"] for r in measured) / wall
        out.update(overlap=0.0, trainer_idle=gen, generator_idle=1.0 - gen)
    else:
        def mean(k):
            return sum(r[k] for r in measured) / len(measured)
        out.update(overlap=mean("rollout/overlap_frac"), trainer_idle=mean("rollout/trainer_idle_frac"),
                   generator_idle=mean("rollout/generator_idle_frac"))
    lags = sorted({int(k.rsplit("_", 1)[1]) for r in measured for k in r if k.startswith("staleness/frac_")})
    out["staleness"] = {d: sum(r.get(f"staleness/frac_{d}", 0.0) for r in measured) / len(measured) for d in lags}
    out["max_staleness"] = max(r["actor/staleness/max"] for r in measured)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="measured steps per setting")
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring (the pipeline fills)")
    parser.add_argument("--etas", default="0,1,2,4", help="max_head_offpolicyness values; 0 is synchronous")
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every setting (after --)")
    args = parser.parse_args()
    etas = [int(x) for x in args.etas.split(",")]
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, model {args.model}, {args.steps} measured steps "
          f"after {args.warmup}; overrides: {' '.join(args.overrides) or '-'}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for eta in etas:
            rows.append(run_setting(eta, args, tmp))
            r = rows[-1]
            print(f"  eta={eta}: {r['step_s']:.2f} s/step ({r['process_s']:.0f} s in all)", flush=True)
    base = next((r for r in rows if r["eta"] == 0), rows[0])
    print("  eta | steps/s | vs sync | s/step | overlap | trainer idle | generator idle | "
          "staleness (share of tokens 0,1,2,...)")
    for r in rows:
        dist = " ".join(f"{d}:{v:.2f}" for d, v in r["staleness"].items())
        print(f"  {r['eta']:3d} | {r['steps_per_s']:7.3f} | {r['steps_per_s'] / base['steps_per_s']:6.2f}x | "
              f"{r['step_s']:6.2f} | {r['overlap']:7.2f} | {r['trainer_idle']:12.2f} | {r['generator_idle']:14.2f} | "
              f"{dist} (max {r['max_staleness']:.0f})")


if __name__ == "__main__":
    main()
