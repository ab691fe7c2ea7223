"""How fast the command line answers, side by side in one run: ``--help``, ``--help KEY``, a typo, a bad
value and a plugin path that does not import (all answered before torch loads, target: at most
``TARGET_S`` seconds each), a rule of the policy loss (checked once the light checks found nothing, with
torch), and the full start of a one-step run (``+scale=tiny total_train_steps=1``, until the process ends).

Every case runs ``--reps`` times, each in a fresh process in a fresh directory, the cases taking turns so
that a change in the machine's load touches them alike; the table gives each case's median (and its
fastest and slowest run), its ratio to the full start's median, and whether it meets the target. Each run
must end as expected (its exit status and a line of its output), or the script stops: a time of the wrong
path is no measurement. Other processes on the CPUs lengthen every time; compare the ratios, and read the
load average printed at the start.

    .venv/bin/python scripts/bench_cli.py                # 5 runs of each case, 3 full starts
    .venv/bin/python scripts/bench_cli.py --reps 9
    .venv/bin/python scripts/bench_cli.py --quick        # one run each, a shortened full start (a smoke run)
    .venv/bin/python scripts/bench_cli.py --tree /tmp/old  # another checkout's command line (git worktree add)
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 1.5
"""The cases answered before torch loads: each median at most this many seconds."""
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
       "TOKENIZERS_PARALLELISM": "false"}
FULL = ["--config-name", "grpo", "+scale=tiny", "total_train_steps=1"]
FULL_EXPECT = "run directory: "
"""What the run's final lines say."""
QUICK_FULL = [*FULL, "sft_warmup.steps=0", "valid_dataset=null", "saver.freq_steps=null", "stats_logger.plot=false"]


@dataclass(frozen=True)
class Case:
    name: str
    args: list[str]
    code: int
    """The exit status a correct run ends with."""
    expect: str
    """Text that a correct run prints (stdout or stderr)."""
    targeted: bool
    """Answered before torch loads: held to ``TARGET_S``."""
    full: bool = False
    """The full start, which the ratios divide by (run ``--full-reps`` times)."""


def cases(quick: bool) -> list[Case]:
    grpo = ["--config-name", "grpo"]
    return [
        Case("--help", ["--help"], 0, "actor.eps_clip:", True),
        Case("--help actor.eps_clip", ["--help", "actor.eps_clip"], 0, "actor.eps_clip", True),
        Case("typo", [*grpo, "actor.eps_clipp=0.3"], 2, "Did you mean 'actor.eps_clip'?", True),
        Case("bad value", [*grpo, "gconfig.n_samples=0"], 2, "gconfig.n_samples: got 0; must be >= 1.", True),
        Case("missing plugin", [*grpo, "reward.fn=mypkg.rewards.score"], 2, "module 'mypkg.rewards' not found", True),
        Case("loss rule (needs torch)", [*grpo, "actor.eps_clip=-1"], 2, "actor.eps_clip: got -1.0; must be >= 0.",
             False),
        Case("full start, 1 step", QUICK_FULL if quick else FULL, 0, FULL_EXPECT, False, full=True),
    ]


def commit(tree: str) -> str:
    """The checkout's commit, with ``+changes`` when its package differs from that commit."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "areal_trainer"], cwd=tree).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + "+changes" * dirty


def cpu() -> str:
    """The CPU's model name and its widest vector extension, as docs/benchmarks.md names machines."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    vector = ["AVX-512" if "avx512f" in flags else "avx2" if "avx2" in flags else "", "AMX" * ("amx_tile" in flags)]
    shown = ", ".join(v for v in vector if v)
    return f"{model}{f' ({shown})' if shown else ''}, {os.cpu_count()} CPUs"


def run_once(case: Case, workdir: str, tree: str) -> float:
    """Wall seconds of one run of ``case`` in a fresh process; stops the script if it ends otherwise."""
    env = dict(os.environ, **ENV, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "areal_trainer", *case.args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - t0
    if proc.returncode != case.code or case.expect not in proc.stdout + proc.stderr:
        sys.exit(f"bench_cli: {case.name!r} ended with exit status {proc.returncode} (expected {case.code}, with "
                 f"{case.expect!r} in its output):\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="runs of each case but the full start (median)")
    ap.add_argument("--full-reps", type=int, default=3, help="runs of the full start (median)")
    ap.add_argument("--quick", action="store_true", help="one run each, full start without warm start, "
                    "evaluation or checkpoint")
    ap.add_argument("--tree", default=ROOT, help="the checkout whose command line is timed (default: this one)")
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    reps, full_reps = (1, 1) if args.quick else (args.reps, args.full_reps)
    todo = cases(args.quick)
    print(f"bench_cli {datetime.datetime.now().isoformat(timespec='seconds')}, commit {commit(tree)}, {cpu()}, "
          f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f} at the start"
          f"{', quick' if args.quick else ''}", flush=True)
    times: dict[str, list[float]] = {c.name: [] for c in todo}
    for i in range(max(reps, full_reps)):
        for case in todo:
            if i < (full_reps if case.full else reps):  # in a fresh directory: the run's outputs go there
                with tempfile.TemporaryDirectory(prefix="bench_cli_") as workdir:
                    times[case.name].append(run_once(case, workdir, tree))
    full = statistics.median(next(times[c.name] for c in todo if c.full))
    print(f"{'case':<24} | {'median s':>8} | {'fastest':>7} | {'slowest':>7} | {'runs':>4} | {'vs full start':>13} | "
          f"<= {TARGET_S} s")
    met = 0
    for case in todo:
        ts = times[case.name]
        median = statistics.median(ts)
        verdict = ("yes" if median <= TARGET_S else "NO") if case.targeted else "-"
        met += verdict == "yes"
        print(f"{case.name:<24} | {median:8.2f} | {min(ts):7.2f} | {max(ts):7.2f} | {len(ts):4d} | "
              f"{median / full:12.3f}x | {verdict}")
    targeted = sum(c.targeted for c in todo)
    print(f"target: {met} of {targeted} cases answered before torch loads within {TARGET_S} s"
          f"{'' if met == targeted else ' (NOT MET)'}; other processes on the CPUs lengthen every time, compare "
          "the ratios")


if __name__ == "__main__":
    main()
