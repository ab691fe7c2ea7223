"""Benchmark the default advantage computation against a per-step loop of the same recurrence, on one
quiet thread and with every core busy, in one run.

Both sides run the same default pipeline on the same random batch (B rows, width S, a prompt,
generated turns separated by tool spans, random padding, truncation and critic values); only the
estimator differs: the vectorised token/turn GAE versus the straightforward loop of
``tests/advantage/reference.py``. The fast side is the bound computation as the trainer calls it
(``AdvantageFn``, on ``ADVANTAGE_THREADS`` intra-op threads: ``areal_trainer/advantage/threads.py`` says
why); the loop side runs in the same wrapper. Two phases:

* quiet: as the machine is (the script prints the share of the CPUs other processes used meanwhile,
  which lengthens every time). Target: every case no slower than ``PREVIOUS_MS``, the previous
  release's figure on one quiet thread, plus ``TOLERANCE`` for timer noise.
* busy: the script starts ``LOAD``, one process that keeps every core busy with torch matrix products
  on as many threads as there are CPUs, as another training job does, and stops it at the end.
  Target: every case at least ``BUSY_TARGET`` times faster than the loop. The last columns time the
  same computation on torch's default thread count (``AdvantageFn(threads=None)``): what it costs when
  its passes wait for threads that the load holds.

Printed per case: the best time of ``--fast-reps`` runs of the fast side and of one loop run (three at
S < 8192), their ratio, ``max |A_fast - A_loop| / max |A_loop|`` (quiet phase), and the targets, which are
set at B=64, S=8192 and judged there only.

    .venv/bin/python scripts/bench_advantage.py                     # B=64, S=8192: both phases, targets
    .venv/bin/python scripts/bench_advantage.py --sizes 1024 8192 32768
    .venv/bin/python scripts/bench_advantage.py --quick             # B=8, S=512, one run each (a smoke run)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # tests/advantage/reference.py, and this checkout's package

from areal_trainer.advantage import AdvantageFn, AdvantageInputs, TemporalResult  # noqa: E402
from areal_trainer.advantage.gae import compute_gae_lambda  # noqa: E402
from areal_trainer.advantage.pipeline import Stage, run_default  # noqa: E402
from areal_trainer.components.advantage import bind_advantage  # noqa: E402
from areal_trainer.config import PPOActorConfig  # noqa: E402
from tests.advantage.reference import token_gae_loop, turn_gae_loop  # noqa: E402

CASES = (("token", 1.0, 1.0), ("token", 0.99, 0.95), ("turn", 1.0, 1.0), ("turn", 0.99, 0.95))
"""``(gae_timestep_unit, discount, gae_lambda)`` of every case."""
TARGET_SHAPE = (64, 8192)
"""``(B, S)`` where the targets are set and judged."""
BUSY_TARGET = 50.0
"""With every core busy, the fast side at least this many times faster than the loop."""
PREVIOUS_MS = {("token", 1.0, 1.0): 8.3, ("token", 0.99, 0.95): 10.1, ("turn", 1.0, 1.0): 13.3,
               ("turn", 0.99, 0.95): 13.4}
"""The previous release's fast side on one quiet thread, ms at B=64, S=8192, per case: commit 9ab73f0 (whose
figures docs/benchmarks.md recorded), 2026-12-03, on an Intel(R) Xeon(R) Processor, 2 CPUs (avx512), torch
2.13.0+cpu, one thread, other processes stopped, this script's batch and its best of 7 runs."""
PREVIOUS_CPU = "Intel(R) Xeon(R) Processor"
TOLERANCE = 0.05
"""How much slower than ``PREVIOUS_MS`` still counts as no slower: the spread of the best of 7 runs on
an idle machine."""
LOAD = ("import os, torch\n"
        "torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count())\n"
        "a = torch.randn(256, 256)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    a = torch.tanh(a @ a)\n")
"""The busy phase's background process: 256x256 matrix products on every CPU, without end."""


def random_batch(n_rows: int, width: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 2, width + 1, (n_rows,), generator=g)
    lengths[: max(n_rows // 8, 1)] = width  # some rows fill the padded width
    pos = torch.arange(width)[None, :]
    attn = pos < lengths[:, None]
    prompt = torch.randint(16, 257, (n_rows, 1), generator=g)
    # Segments of ~64 tokens; about 70% are generated turns, the rest tool/user spans.
    starts = torch.rand(n_rows, width, generator=g) < 1 / 64
    starts[:, 0] = False
    seg = starts.long().cumsum(-1)
    generated = (torch.rand(n_rows, width, generator=g) < 0.7).gather(1, seg)
    loss_mask = generated & attn & (pos >= prompt)
    return {
        "input_ids": torch.zeros(n_rows, width, dtype=torch.long),
        "attention_mask": attn.long(),
        "loss_mask": loss_mask.long(),
        "logprobs": -torch.rand(n_rows, width, generator=g),
        "rewards": torch.randn(n_rows, generator=g),
        "values": torch.randn(n_rows, width, generator=g),
        "is_truncated": torch.rand(n_rows, generator=g) < 0.5,
        "turn_ids": torch.where(loss_mask, seg, -1).int(),
    }


def loop_estimator(inputs):
    """The built-in estimators' arithmetic with the per-step loop kernels."""
    turn = inputs.time_unit == "turn"
    lam = compute_gae_lambda(inputs.loss_mask, inputs.turn_ids, time_unit=inputs.time_unit,
                             gae_lambda=inputs.gae_lambda, kwargs=inputs.gae_lambda_kwargs)
    boot = inputs.bootstrap_values * inputs.is_truncated
    task = inputs.outcome_rewards + inputs.process_rewards
    if turn:
        adv, ret = turn_gae_loop(task, inputs.values, inputs.loss_mask, inputs.turn_ids, boot,
                                 discount=inputs.discount, gae_lambda=lam)
        adv = adv + inputs.kl_rewards
    else:
        adv, ret = token_gae_loop(task + inputs.kl_rewards, inputs.values, inputs.loss_mask, boot,
                                  discount=inputs.discount, gae_lambda=lam)
    return TemporalResult(advantages=adv.float(), returns=ret.float(), total_rewards=task + inputs.kl_rewards)


@dataclasses.dataclass(frozen=True)
class Bound:
    """One case's computations: the trainer's (fast), on torch's default threads, and the loop."""

    inputs: AdvantageInputs
    fast: AdvantageFn
    default_threads: AdvantageFn
    loop: AdvantageFn


def bind_case(data: dict, unit: str, gamma: float, lam: float) -> Bound:
    cfg = PPOActorConfig(kl_ctl=0.0, discount=gamma, gae_lambda=lam, gae_timestep_unit=unit)
    fast = bind_advantage(cfg)
    loop_stages = dataclasses.replace(fast.stages, estimator=Stage("loop", loop_estimator, builtin=False))
    return Bound(AdvantageInputs(data, cfg), fast,
                 AdvantageFn(lambda i: run_default(i, fast.stages), fast.label, fast.stages, threads=None),
                 AdvantageFn(lambda i: run_default(i, loop_stages), "loop", loop_stages, threads=fast.threads))


def best_time(fn, reps: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


class CpuShare:
    """Shares of all CPUs used meanwhile, from ``/proc`` (None elsewhere): by the processes ``tracked``
    (each alone), and by every process but this one and those."""

    def __init__(self, tracked: tuple[int, ...] = ()):
        self.tracked = tracked
        self.start = self._sample()

    @staticmethod
    def _ticks(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def _sample(self) -> tuple[int, ...] | None:
        try:
            with open("/proc/stat") as f:
                vals = [int(x) for x in f.readline().split()[1:9]]
            return (sum(vals), sum(vals) - vals[3] - vals[4], self._ticks(os.getpid()),
                    *(self._ticks(p) for p in self.tracked))
        except (OSError, ValueError, IndexError):
            return None

    def shares(self) -> tuple[float | None, list[float | None]]:
        """``(others, [each tracked process])``."""
        end = self._sample()
        if self.start is None or end is None or end[0] == self.start[0]:
            return None, [None] * len(self.tracked)
        total, busy, mine, *tracked = (e - s for e, s in zip(end, self.start))
        return max(busy - mine - sum(tracked), 0) / total, [t / total for t in tracked]


def share_text(share: float | None) -> str:
    return "n/a (no /proc)" if share is None else f"{share:.0%} of the CPUs"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def commit() -> str:
    """This checkout's commit, with ``+changes`` when its package or this script differ from it."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "areal_trainer", "scripts/bench_advantage.py"],
                               cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + "+changes" * dirty


def start_load() -> subprocess.Popen:
    """Start ``LOAD`` and wait until it computes (its torch import takes seconds)."""
    proc = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise SystemExit("bench_advantage: the background load did not start (python -c LOAD exited).")
    time.sleep(0.5)  # let its threads settle on the cores
    return proc


def stop_load(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def fast_and_loop(b: Bound, width: int, reps: int) -> tuple[tuple[float, object], tuple[float, object]]:
    """Best time and result of the fast side (``reps`` runs) and of the loop (one run, three below S=8192)."""
    return best_time(lambda: b.fast(b.inputs), reps), best_time(lambda: b.loop(b.inputs), 1 if width >= 8192 else 3)


def quiet_phase(bound: dict, sizes: list[int], n_rows: int, reps: int) -> tuple[int, int]:
    """Print the quiet table; ``(targets held, targets judged)``."""
    meter = CpuShare()
    lines = []
    held = judged = 0
    for width in sizes:
        for case in CASES:
            b = bound[width, case]
            (t_fast, a), (t_loop, ref) = fast_and_loop(b, width, reps)
            scale = ref.advantages.abs().max().item()
            diff = (a.advantages - ref.advantages).abs().max().item() / max(scale, 1e-12)
            prev = PREVIOUS_MS.get(case) if (n_rows, width) == TARGET_SHAPE else None
            if prev is None:
                verdict, prev_text = "-", "-"
            else:
                ok = t_fast * 1e3 <= prev * (1 + TOLERANCE)
                held, judged = held + ok, judged + 1
                verdict, prev_text = ("ok" if ok else "SLOWER"), f"{prev:.1f}"
            lines.append(f"{width:>6} {case[0]:>5} {case[1]:>4}/{case[2]:<5} {t_fast * 1e3:>9.1f} {t_loop * 1e3:>9.0f} "
                         f"{t_loop / t_fast:>8.0f}x {diff:>14.1e} {prev_text:>11} {verdict:>7}")
    others, _ = meter.shares()
    print(f"quiet: the fast side on {b.fast.threads or torch.get_num_threads()} intra-op thread (ADVANTAGE_THREADS); "
          f"other processes used {share_text(others)} meanwhile")
    print(f"{'S':>6} {'unit':>5} {'gamma/lam':>10} {'fast ms':>9} {'loop ms':>9} {'speed-up':>9} {'max|dA|/scale':>14} "
          f"{'previous ms':>11} {'target':>7}")
    print("\n".join(lines))
    return held, judged


def busy_phase(bound: dict, sizes: list[int], n_rows: int, reps: int) -> tuple[int, int]:
    """Start the load, print the busy table, stop the load; ``(targets held, targets judged)``."""
    default = torch.get_num_threads()
    proc = start_load()
    try:
        meter = CpuShare(tracked=(proc.pid,))
        lines = []
        held = judged = 0
        for width in sizes:
            for case in CASES:
                b = bound[width, case]
                (t_fast, _), (t_loop, _) = fast_and_loop(b, width, reps)
                t_dflt, _ = best_time(lambda: b.default_threads(b.inputs), reps)  # noqa: B023
                ratio = t_loop / t_fast
                if (n_rows, width) == TARGET_SHAPE:
                    ok = ratio >= BUSY_TARGET
                    held, judged = held + ok, judged + 1
                    verdict = "ok" if ok else "BELOW"
                else:
                    verdict = "-"
                lines.append(f"{width:>6} {case[0]:>5} {case[1]:>4}/{case[2]:<5} {t_fast * 1e3:>9.1f} "
                             f"{t_loop * 1e3:>9.0f} {ratio:>8.0f}x {verdict:>7} {t_dflt * 1e3:>11.1f} "
                             f"{t_loop / t_dflt:>8.0f}x")
        others, (load,) = meter.shares()
    finally:
        stop_load(proc)
    print(f"busy: LOAD on every CPU (pid {proc.pid}, stopped after the table) used {share_text(load)}, other "
          f"processes {share_text(others)} meanwhile")
    print(f"{'S':>6} {'unit':>5} {'gamma/lam':>10} {'fast ms':>9} {'loop ms':>9} {'speed-up':>9} {'target':>7} "
          f"{f'{default} thr ms':>11} {'speed-up':>9}")
    print("\n".join(lines))
    return held, judged


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=TARGET_SHAPE[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[TARGET_SHAPE[1]])
    ap.add_argument("--fast-reps", type=int, default=7, help="runs of the fast side; the best time counts")
    ap.add_argument("--quick", action="store_true", help="B=8, S=512, one run each: a smoke run, no targets")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.sizes, args.fast_reps = 8, [512], 1
    now = datetime.datetime.now().isoformat(timespec="minutes")
    print(f"bench_advantage {now}, commit {commit()}, torch {torch.__version__}, {cpu_name()}, {os.cpu_count()} CPUs "
          f"({torch.backends.cpu.get_cpu_capability()}), torch's default {torch.get_num_threads()} threads, "
          f"B={args.rows}")
    if cpu_name() != PREVIOUS_CPU:
        print(f"note: PREVIOUS_MS was measured on an {PREVIOUS_CPU}; on this CPU the quiet target is indicative only")
    bound = {}
    for width in args.sizes:
        data = random_batch(args.rows, width, seed=width)
        for case in CASES:
            bound[width, case] = b = bind_case(data, *case)
            b.fast(b.inputs)  # first calls allocate; time the steady state
    q_held, q_judged = quiet_phase(bound, args.sizes, args.rows, args.fast_reps)
    b_held, b_judged = busy_phase(bound, args.sizes, args.rows, args.fast_reps)
    if q_judged + b_judged == 0:
        print(f"targets: not judged (they are set at B={TARGET_SHAPE[0]}, S={TARGET_SHAPE[1]})")
    else:
        print(f"targets at B={TARGET_SHAPE[0]}, S={TARGET_SHAPE[1]}: quiet (<= previous release +{TOLERANCE:.0%}) "
              f"{q_held} of {q_judged} hold; busy (>= {BUSY_TARGET:.0f}x the loop) {b_held} of {b_judged} hold")


if __name__ == "__main__":
    main()
