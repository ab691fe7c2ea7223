"""Reward execution in worker processes against the serial in-process loop, side by side in one run.

Two measurements, both through the whole layer (``RewardService`` -> ``FunctionReward`` ->
``WorkerPool``), with the workers started and the function imported before the clock starts:

* throughput: a CPU-bound reward (a pure-Python loop calibrated here to ``--ms`` milliseconds per
  call, no sleeping: workers that shared one core would gain nothing) on ``--samples`` samples,
  serial (``workers=0``, in this process) against ``--workers`` worker processes; samples/s and the
  ratio, with the target (pool >= 1.7x serial with 2 workers on 2 cores);
  ``cores`` is the CPU time of this process and its workers per second of wall time: on a shared
  machine it shows how much of the cores the run actually got (Linux: read from /proc);
* overhead: the time per call of a trivial reward (returns 1.0) with workers = 0, 1 and 2: what the
  pool adds to every call (two pickled messages and a wakeup on each side);
* isolation: ``areal_trainer.reward.code.unit_tests`` on a right solution with four tests, in its
  default box (``isolation=auto``: namespaces where the kernel allows them), in the Landlock box
  (``landlock``) and without a box (``off``): the median time of one call in this process, each box's
  difference to ``off`` (target: at most 20 ms), and the pool's throughput each way with ``--workers``
  workers (target: a box costs at most 25% of it). A box the kernel refuses is named, not measured.

    .venv/bin/python scripts/bench_rewards.py                     # 256 samples, 50 ms, 2 workers
    .venv/bin/python scripts/bench_rewards.py --samples 64 --ms 20
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from areal_trainer.reward.functions import RewardFunction, RewardSample  # noqa: E402
from areal_trainer.reward.service import FunctionReward, RewardService  # noqa: E402

MODULE = os.path.splitext(os.path.basename(__file__))[0]  # workers import this file's functions by name
TARGET = 1.7
ISOLATION_MS, ISOLATION_DROP = 20.0, 0.25
SOLUTION = "```python\ndef f(x):\n    return 3 * x + 2\n```"
TESTS = "assert f(1) == 5\nassert f(2) == 8\nassert f(0) == 2\nassert f(-1) == -1"


def busy(prompt, completion, answer, iterations: int = 1_000_000) -> float:
    """A CPU-bound reward: ``iterations`` steps of pure-Python arithmetic (holds the GIL throughout)."""
    x = 0
    for i in range(iterations):
        x = (x + i * i) % 1_000_003
    return float(x % 2)


def trivial(prompt, completion, answer) -> float:
    return 1.0


def calibrate(ms: float) -> int:
    """Iterations of :func:`busy` that take about ``ms`` milliseconds here (best of 3 probes)."""
    probe = 200_000
    best = min(_timed(lambda: busy(None, None, None, probe)) for _ in range(3))
    return max(1, int(probe * ms / 1e3 / best))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def service(name: str, workers: int, **kwargs) -> RewardService:
    fn = RewardFunction.bind(name if "." in name else f"{MODULE}.{name}", kwargs=kwargs, key="bench")
    return RewardService([FunctionReward(fn, workers=workers, timeout=600.0)])


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of this process and of the worker processes ``pids`` (Linux: from /proc)."""
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def run(name: str, workers: int, samples: list, reps: int, **kwargs) -> tuple[float, float]:
    """Best wall time of ``reps`` scorings of ``samples`` (after a warm-up that starts the workers),
    and the cores it used: CPU seconds of this process and the workers per wall second."""
    with service(name, workers, **kwargs) as svc:
        svc.score(samples[: max(2 * workers, 1)])
        pids = svc.sources[0].pool.pids
        best, cores = float("inf"), 0.0
        for _ in range(reps):
            cpu, t0 = cpu_seconds(pids), time.perf_counter()
            scores = svc.score(samples)
            seconds = time.perf_counter() - t0
            if seconds < best:
                best, cores = seconds, (cpu_seconds(pids) - cpu) / seconds
            failed = scores.metrics()["reward/errors"] + scores.metrics()["reward/worker_deaths"]
            if failed:
                raise SystemExit(f"{name} with workers={workers}: {failed:.0f} calls failed")
    return best, cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--ms", type=float, default=50.0, help="milliseconds per call of the CPU-bound reward")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of the pool side")
    ap.add_argument("--reps", type=int, default=3, help="runs of the overhead case; the best time counts")
    args = ap.parse_args()
    samples = [RewardSample(f"prompt {i}", f"completion {i}", str(i)) for i in range(args.samples)]
    iterations = calibrate(args.ms)
    per_call = _timed(lambda: busy(None, None, None, iterations)) * 1e3
    load = os.getloadavg()[0]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU cores (load average {load:.1f} at the start: other "
          f"processes on the cores lower the pool's gain), {args.samples} samples, CPU-bound reward of "
          f"{per_call:.1f} ms per call ({iterations} iterations)")
    print(f"{'case':<26} {'workers':>8} {'seconds':>9} {'samples/s':>10} {'vs serial':>10} {'cores':>6}")
    cases = {workers: run("busy", workers, samples, 1, iterations=iterations) for workers in (0, args.workers)}
    serial = cases[0][0]
    for workers, (seconds, used) in cases.items():
        print(f"{'cpu-bound ' + format(per_call, '.0f') + ' ms':<26} {workers:>8} {seconds:>9.2f} "
              f"{args.samples / seconds:>10.1f} {serial / seconds:>9.2f}x {used:>6.2f}")
    pooled = cases[args.workers][0]
    ratio = serial / pooled
    verdict = "met" if ratio >= TARGET else "NOT met"
    print(f"target: workers={args.workers} >= {TARGET}x serial on {os.cpu_count()} cores: {verdict} ({ratio:.2f}x)")
    # Independent of what else runs on the machine: the CPU each sample cost, all processes included.
    per_sample = [seconds * used / args.samples * 1e3 for seconds, used in cases.values()]
    print(f"CPU per sample: serial {per_sample[0]:.1f} ms, workers={args.workers} {per_sample[1]:.1f} ms "
          f"({per_sample[1] / per_sample[0] - 1:+.1%}: the speed-up the cores allow is kept when this is small)")
    print()
    print(f"{'overhead (trivial reward)':<26} {'workers':>8} {'seconds':>9} {'ms/call':>10}")
    for workers in (0, 1, 2):
        seconds, _ = run("trivial", workers, samples, args.reps)
        print(f"{'trivial':<26} {workers:>8} {seconds:>9.4f} {seconds / args.samples * 1e3:>10.3f}")
    print()
    isolation(args)


def isolation(args) -> None:
    """The ``isolation`` measurement (see the module docstring)."""
    from areal_trainer.reward.code import unit_tests

    calls = {}
    for mode in ("off", "auto", "landlock"):
        try:
            unit_tests("p", SOLUTION, TESTS, isolation=mode)  # warm: the first start reads the files
        except RuntimeError as e:  # a box this machine refuses: nothing to measure
            print(f"{'unit_tests, one call':<26} {mode:>8} not measured: {e}")
            continue
        times = [_timed(lambda m=mode: unit_tests("p", SOLUTION, TESTS, isolation=m)) * 1e3 for _ in range(15)]
        calls[mode] = sorted(times)[len(times) // 2]
    for mode in [m for m in ("auto", "landlock") if m in calls]:
        added = calls[mode] - calls["off"]
        print(f"{'unit_tests, one call':<26} {'off':>8} {calls['off']:>8.1f} ms   {mode:>6} {calls[mode]:>8.1f} ms   "
              f"isolation adds {added:+.1f} ms: target <= {ISOLATION_MS:.0f} ms "
              f"{'met' if added <= ISOLATION_MS else 'NOT met'}")
    code_samples = [RewardSample(f"prompt {i}", SOLUTION, TESTS) for i in range(max(32, args.samples // 4))]
    rate = {}
    for mode in calls:
        seconds, _ = run("areal_trainer.reward.code.unit_tests", args.workers, code_samples, args.reps, isolation=mode)
        rate[mode] = len(code_samples) / seconds
    for mode in [m for m in ("auto", "landlock") if m in rate]:
        drop = 1 - rate[mode] / rate["off"]
        print(f"{'unit_tests, pool':<26} {args.workers:>8} off {rate['off']:>6.1f}/s   {mode} {rate[mode]:>6.1f}/s   "
              f"isolation costs {drop:.1%} of the throughput: target <= {ISOLATION_DROP:.0%} "
              f"{'met' if drop <= ISOLATION_DROP else 'NOT met'}")


if __name__ == "__main__":
    main()
