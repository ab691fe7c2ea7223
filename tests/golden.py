"""Comparing a run's metrics with records made earlier, possibly on another machine.

A record is exact on the machine and kernels that wrote it: same CPU, same vector extensions the
kernels use (``ATEN_CPU_CAPABILITY``), same thread count and same torch. Anywhere else the float
kernels sum in another order, and every value carries rounding noise of a few float32 epsilons
(``EPS = 2**-23``) of the *terms* it is made of. So each metric is compared within

    |got - recorded| <= K * EPS * scale

where ``scale`` is the magnitude of the terms behind the value, read from the recorded record, and
``K`` is the multiple of epsilon its computation may accumulate (sums over hundreds of tokens,
three training steps whose weights carry the noise forward). ``RULES`` gives both for every key,
with the reason. Quantities bounded away from zero scale by themselves (a relative tolerance);
quantities that cancel (a loss, a mean advantage, a KL estimate, a mean log-ratio) scale by the
size of their terms, so their absolute tolerance does not shrink with the value.

Counts and everything decided by sampled tokens are exact everywhere: a float difference of 1e-7
moves a sampling or clipping threshold past the value it is compared with with a probability of
the same order per token, so the tokens, rewards, clip and mask counts of a few hundred tokens
are the same on every CPU.

``python -m tests.golden`` measures the spread on this machine: it runs the golden configuration
under several kernel settings and prints, per metric, the largest deviation from the records and
how much of its tolerance that uses (see CONTRIBUTING.md).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass

EPS = 2.0**-23
"""float32 machine epsilon: the relative rounding of one float32 operation."""

STEPS = 3
ARGS = ["+scale=tiny", f"total_train_steps={STEPS}", "gconfig.n_samples=4", "train_dataset.batch_size=4",
        "actor.ppo_n_minibatches=2", "saver.freq_steps=null", f"evaluator.freq_steps={STEPS}",
        "reward.fn=tests.plugins.digit_share_reward"]
"""The golden configuration: 3 steps, two minibatches per step so that ratios, clips and SAPO gates move,
and a reward with variance inside every group of the untrained model."""
RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e", "golden_presets.json")


def cpu_name() -> str:
    """The CPU model and the vector extensions it offers."""
    name, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                if key.strip() == "flags":
                    flags = " ".join(sorted(x for x in value.split() if x.startswith(("avx", "amx", "fma"))))
                    break
    except OSError:
        pass
    return f"{name} | {flags}"


def kernels(threads: int | None = None) -> dict:
    """What decides the float kernels of a training subprocess started from this environment: the CPU,
    the vector extensions torch uses (``ATEN_CPU_CAPABILITY`` caps them), the thread count
    (``OMP_NUM_THREADS``; the tests' runs default to 1) and torch's version."""
    import torch

    n = threads if threads is not None else int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    return {"cpu": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(), "threads": n,
            "torch": torch.__version__.split("+")[0]}


# -- tolerances ---------------------------------------------------------------------------------------
def _itself(record: dict, value: float) -> float:
    return abs(value)


def _logp(record: dict, value: float) -> float:
    """The size of a token's log-probability: the policy's entropy, the mean of -log pi over its
    vocabulary (log-ratios and KL estimates are differences of such numbers)."""
    return max(record.get("actor/entropy", 10.0), 1.0)


def _advantage(record: dict, value: float) -> float:
    """A policy loss is a mean of advantage-weighted terms (ratios, gates, CISPO's weighted log-probs):
    their size is the mean absolute advantage times a log-probability. With a teacher the distillation
    term adds terms of the size of the teacher's log-probs (absent without one: nothing changes)."""
    return (record.get("advantage/abs_mean", 1.0) + abs(record.get("distill/teacher_logp", 0.0))) * _logp(record, value)


def _returns(record: dict, value: float) -> float:
    """Values, returns and their residuals are of the size of the returns (their root mean square)."""
    return math.sqrt(max(record.get("critic/return/sq_mean", 1.0), 1.0))


def _unit(record: dict, value: float) -> float:
    return 1.0


@dataclass(frozen=True)
class Rule:
    """``|got - recorded| <= k * EPS * scale(record, recorded)``; ``k = 0``: equal."""

    k: float
    scale: Callable[[dict, float], float]
    why: str

    def tolerance(self, record: dict, value: float) -> float:
        return self.k * EPS * self.scale(record, value)


EXACT = Rule(0, _unit, "a count, or decided by sampled tokens and thresholds: the same on every CPU")
RULES: list[tuple[tuple[str, ...], Rule]] = [
    (("step", "data/prompt_ids", "lr", "sft/steps", "*n_valid_tokens", "*/normalizer", "*/normalizer_used/max",
      "rollout/*", "reward/correct_frac", "*reward/errors", "*reward/timeouts", "*reward/worker_deaths",
      "*reward/nonfinite", "*reward/none", "*reward/all_none", "*skipped_steps", "*update/tokens",
      "eval/accuracy", "staleness/*", "actor/staleness*", "*clip_frac*", "*masked_frac", "actor/prox_nonfinite_frac",
      "distill/teacher_rows/*"),
     EXACT),
    (("actor/token_loss", "update/loss", "advantage/mean"),
     Rule(64, _advantage, "a mean of advantage-weighted terms that nearly cancel: absolute, scaled by the terms")),
    (("actor/approx_kl", "actor/behave_approx_kl", "mismatch/*", "advantage/kl_reward", "actor/importance_ratio/*",
      "actor/behave_ratio/*", "actor/behave_weight*", "actor/cispo/weight", "actor/sapo/*", "distill/reverse_kl",
      "distill/token_loss", "distill/is_weight", "eval/distill/reverse_kl"),
     Rule(64, _logp, "exp or mean of log-prob differences: absolute, scaled by a log-prob (a max over tokens "
                     "picks the noisiest)")),
    (("critic/value/mean", "critic/old_value/mean", "critic/residual/mean", "critic/return/mean"),
     Rule(64, _returns, "a mean of values or returns of either sign: absolute, scaled by the returns' size")),
    (("critic/explained_variance*",),
     Rule(64, _unit, "1 - var(residual)/var(return), near 0: absolute, the terms are of order 1")),
    (("actor/entropy", "*grad_norm", "sft/loss", "critic/value_loss", "critic/update/loss", "*/sq_mean",
      "advantage/abs_mean", "reward/task", "reward/sampled", "eval/reward", "reward/*", "eval/reward/*",
      "distill/teacher_logp", "eval/distill/teacher_logp"),
     Rule(64, _itself, "a mean of rewards, a loss or a norm, bounded away from zero: relative")),
]


def rule_of(key: str) -> Rule | None:
    for patterns, rule in RULES:
        if any(fnmatch.fnmatchcase(key, p) for p in patterns):
            return rule
    return None


@dataclass(frozen=True)
class Deviation:
    algo: str
    step: int
    key: str
    got: object
    want: object
    tolerance: float

    @property
    def used(self) -> float:
        """The share of its tolerance the deviation uses (inf: outside an exact rule)."""
        if not (isinstance(self.got, float) and isinstance(self.want, float)):
            return 0.0 if self.got == self.want else math.inf
        d = abs(self.got - self.want)
        return d / self.tolerance if self.tolerance else (0.0 if d == 0 else math.inf)

    def __str__(self) -> str:
        return (f"{self.algo} step {self.step} {self.key}: got {self.got!r}, recorded {self.want!r} "
                f"(tolerance {self.tolerance:.3g})")


def comparable(record: dict) -> dict:
    """Everything but timings, whether the warm start came from the cache, and how many tokens the
    forwards computed (fewer with shared-prefix training: how the maths ran, not what it gave)."""
    return {k: v for k, v in record.items()
            if not k.startswith(("time/", "perf/", "sft/cached")) and not k.endswith("/tokens_computed")}


def read_run(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [comparable(json.loads(line)) for line in f if line.strip()]


def deviations(runs: dict[str, list[dict]], records: dict[str, list[dict]], exact: bool) -> list[Deviation]:
    """Every metric of ``runs`` against ``records`` (both by preset); with ``exact`` every value must be equal.
    Missing steps or keys, and keys no rule covers, come back with an infinite share used."""
    out = []
    for algo, got in runs.items():
        want = records.get(algo)
        if want is None or [r["step"] for r in got] != [r["step"] for r in want]:
            out.append(Deviation(algo, -1, "steps", [r["step"] for r in got],
                                 want and [r["step"] for r in want], 0.0))
            continue
        for g, w in zip(got, want):
            for k, v in w.items():
                rule = rule_of(k)
                tol = 0.0 if exact or rule is None or not isinstance(v, float) else rule.tolerance(w, v)
                dev = Deviation(algo, w["step"], k, g.get(k), v, tol)
                if k not in g or rule is None or dev.used > 1:
                    out.append(dev)
    return out


def spread(runs: dict[str, list[dict]], records: dict[str, list[dict]]) -> dict[str, tuple[float, float, float]]:
    """Per metric: the largest absolute and relative deviation from the records and the largest share of
    its tolerance used."""
    out: dict[str, tuple[float, float, float]] = {}
    for algo, got in runs.items():
        for g, w in zip(got, records.get(algo, [])):
            for k, v in w.items():
                if not isinstance(v, float) or not isinstance(g.get(k), float):
                    continue
                d = abs(g[k] - v)
                rule = rule_of(k)
                tol = rule.tolerance(w, v) if rule is not None else 0.0
                used = d / tol if tol else (0.0 if d == 0 else math.inf)
                a, r, u = out.get(k, (0.0, 0.0, 0.0))
                out[k] = (max(a, d), max(r, d / abs(v) if v else (0.0 if d == 0 else math.inf)), max(u, used))
    return out


def load_records() -> dict:
    with open(RECORDS) as f:
        return json.load(f)


# -- running the golden configuration -------------------------------------------------------------------
def presets() -> list[str]:
    """Every preset in conf/algo: AReaL's ten first (their sweep job numbers stay put), then any added."""
    first = ["ppo", "grpo", "drgrpo", "liteppo", "rloo", "dapo", "sapo", "gspo", "icepop", "kpop"]
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "algo")
    shipped = sorted(f[:-5] for f in os.listdir(conf) if f.endswith(".yaml"))
    return first + [a for a in shipped if a not in first]


def has_critic(algo: str) -> bool:
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "algo", f"{algo}.yaml")
    with open(conf) as f:
        return "critic:" in f.read()


def has_teacher(algo: str) -> bool:
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "algo", f"{algo}.yaml")
    with open(conf) as f:
        return "teacher:" in f.read()


def sharing_off(algo: str) -> list[str]:
    """The records come from the unshared forward (shared-prefix training sums in another order)."""
    return ["actor.enable_tree_training=false"] + (["critic.enable_tree_training=false"] if has_critic(algo) else []) \
        + (["teacher.enable_tree_training=false"] if has_teacher(algo) else [])


def run_presets(cwd, *, shared: bool, algos: list[str] | None = None, env: dict | None = None,
                extra: list[str] = ()) -> dict[str, list[dict]]:
    """Run the golden configuration of ``algos`` (default: every preset) in ``cwd``; metrics by preset.
    ``shared``: with the defaults (shared-prefix training), as one sweep; else each preset unshared."""
    from .e2e.helpers import cli

    algos = algos or presets()
    if shared:
        cli(["-m", f"algo={','.join(algos)}", *ARGS, *extra, "hydra.sweep.dir=sweep"], cwd=cwd, timeout=900, env=env)
        return {a: read_run(os.path.join(cwd, "sweep", f"{i}-{a}-seed1")) for i, a in enumerate(algos)}
    out = {}
    for a in algos:
        cli([f"algo={a}", *ARGS, *sharing_off(a), *extra, f"hydra.run.dir=runs/{a}"], cwd=cwd, env=env)
        out[a] = read_run(os.path.join(cwd, "runs", a))
    return out


SETTINGS = {
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "2 threads": {"OMP_NUM_THREADS": "2"},
    "ATEN_CPU_CAPABILITY=default": {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"},
    "ATEN_CPU_CAPABILITY=default, 2 threads": {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"},
    "ATEN_CPU_CAPABILITY=avx2": {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"},
}
"""Kernel settings ``python -m tests.golden`` measures (the tests' runs use one thread by default)."""


def main() -> None:
    """Measure how far this machine's kernel settings take every metric from the records."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--algos", nargs="*", default=None)
    args = parser.parse_args()
    records = load_records()
    print(f"records made on: {records['kernels']}")
    total: dict[str, tuple[float, float, float]] = {}
    for name in args.settings:
        for shared in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                runs = run_presets(tmp, shared=shared, algos=args.algos, env=SETTINGS[name])
            label = f"{name}, {'shared' if shared else 'unshared'}"
            s = spread(runs, records["runs"])
            bad = deviations(runs, records["runs"], exact=False)
            print(f"{label:48s} largest share of a tolerance used: {max(u for _, _, u in s.values()):.3f}; "
                  f"outside: {len(bad)}{'' if not bad else ' e.g. ' + str(bad[0])}", flush=True)
            for k, (a, r, u) in s.items():
                ta, tr, tu = total.get(k, (0.0, 0.0, 0.0))
                total[k] = (max(a, ta), max(r, tr), max(u, tu))
    print(f"\n{'metric':45s} {'max |abs|':>10s} {'max rel':>10s} {'tol used':>9s}")
    for k in sorted(total):
        a, r, u = total[k]
        print(f"{k:45s} {a:10.2e} {r:10.2e} {u:9.3f}")


if __name__ == "__main__":
    main()
