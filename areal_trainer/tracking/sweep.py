"""Compare the runs of a sweep: a table (held-out accuracy before/after RL, or the held-out mean reward
of runs without a verifier; training reward, time per step, per algorithm and seed), for off-policy runs
a second one (staleness, clip fraction, train/inference mismatch, masked tokens), and one PNG with every
algorithm's reward curve.
Runs are labelled by ``algorithm``, with the staleness bound and the rollout precision when set
(``grpo η=2 bfloat16``), so settings swept together stay apart.

Written into the sweep directory as ``comparison.md`` and ``comparison.png`` at the end of every
``-m`` sweep (a Hydra callback, see ``conf/config.yaml``), or by
``python scripts/compare_sweep.py <sweep_dir>``.
"""

from __future__ import annotations

import os
from collections import defaultdict

import yaml
from hydra.experimental.callback import Callback

from .logger import read_metrics
from .plot import held_out_kind

TAIL = 10
"""Training reward is the mean over the last ``TAIL`` steps (one step is a noisy sample)."""


def _reward(record: dict) -> float:
    """The step's mean reward over every sampled answer. ``reward/task`` is over the trained batch,
    which a dynamic filter (DAPO) has already cleared of zero-variance groups, so it is not
    comparable across algorithms; it is the fallback for records without ``reward/sampled``."""
    return record.get("reward/sampled", record["reward/task"])


OFFPOLICY_KEYS = {"staleness": "actor/staleness", "max staleness": "actor/staleness/max",
                  "clip frac": "actor/clip_frac", "|log pi_prox - log pi_behav|": "mismatch/abs_logp_diff",
                  "masked frac": "actor/rejection/masked_frac", "behaviour KL (k3)": "mismatch/kl_k3"}
"""Columns of the off-policy table: the mean over all steps of each metric (max for max staleness)."""


def label(cfg: dict) -> str:
    """``algorithm``, plus ``η=<eta>`` (and ``lagged``) and the rollout precision when they are set."""
    out = str(cfg.get("algorithm", "?"))
    rollout = cfg.get("rollout") or {}
    eta = rollout.get("max_head_offpolicyness") or 0
    if eta:
        out += f" η={eta}" + (" lagged" if rollout.get("offpolicy_mode") == "lagged" else "")
    if rollout.get("dtype"):
        out += f" {rollout['dtype']}"
    return out


def _offpolicy(steps: list[dict]) -> dict[str, float | None]:
    out = {}
    for name, key in OFFPOLICY_KEYS.items():
        vals = [r[key] for r in steps if key in r]
        out[name] = (max(vals) if name == "max staleness" else sum(vals) / len(vals)) if vals else None
    return out


def _run_info(run_dir: str) -> dict | None:
    metrics = os.path.join(run_dir, "metrics.jsonl")
    cfg_path = os.path.join(run_dir, ".hydra", "config.yaml")
    if not (os.path.isfile(metrics) and os.path.isfile(cfg_path)):
        return None
    with open(cfg_path) as f:
        cfg = yaml.safe_load(f)
    records = read_metrics(metrics)
    steps = [r for r in records if "reward/task" in r]
    kind = held_out_kind(records)
    held = [r["eval/accuracy" if kind == "accuracy" else "eval/reward"] for r in records
            if ("eval/accuracy" if kind == "accuracy" else "eval/reward") in r]
    acc = held if kind == "accuracy" else []
    times = [r["time/step"] for r in steps if "time/step" in r]
    return {
        "algorithm": label(cfg), "seed": cfg.get("seed"), "dir": os.path.basename(run_dir),
        "offpolicy": _offpolicy(steps),
        "eta": (cfg.get("rollout") or {}).get("max_head_offpolicyness") or 0,
        "steps": len(steps), "acc_before": acc[0] if acc else None, "acc_after": acc[-1] if len(acc) > 1 else None,
        "held_out": kind, "before": held[0] if held else None, "after": held[-1] if len(held) > 1 else None,
        "reward_last": sum(_reward(r) for r in steps[-TAIL:]) / max(1, len(steps[-TAIL:])) if steps else None,
        "sec_per_step": sum(times) / len(times) if times else None,
        "curve": [(r["step"], _reward(r)) for r in steps],
    }


def _job_order(name: str):
    """Hydra's job number first ("10-dapo" after "2-grpo"), then the name."""
    head = name.split("-", 1)[0]
    return (0, int(head), name) if head.isdigit() else (1, 0, name)


def collect(sweep_dir: str) -> list[dict]:
    runs = []
    for name in sorted(os.listdir(sweep_dir), key=_job_order):
        info = _run_info(os.path.join(sweep_dir, name))
        if info:
            runs.append(info)
    return runs


def _fmt(x, pct=False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if pct else f"{x:.3f}"


HEADERS = {frozenset({"accuracy"}): ("held-out acc.", "acc.", "change (points)"),
           frozenset({"reward"}): ("held-out mean reward", "mean reward", "change"),
           frozenset({"accuracy", "reward"}): ("held-out acc. or mean reward*", "acc. or mean reward*", "change*")}
"""Column names by what the runs' held-out numbers are: accuracy where a run had a verifier, else its mean
held-out reward (never called an accuracy)."""
MIXED_NOTE = ("* a percentage is a held-out accuracy (points of change); a number with three decimals is the "
              "held-out mean reward of a run without a verifier.")


def _held(r: dict, key: str) -> str:
    return _fmt(r[key], pct=r["held_out"] == "accuracy")


def _gain(r: dict) -> float | None:
    if r["after"] is None or r["before"] is None:
        return None
    return (100 if r["held_out"] == "accuracy" else 1) * (r["after"] - r["before"])


def _fmt_gain(r: dict, gain: float | None) -> str:
    return "-" if gain is None else f"{gain:+.1f}" if r["held_out"] == "accuracy" else f"{gain:+.3f}"


def table(runs: list[dict]) -> str:
    """Markdown: one row per run, then one row per algorithm with the mean over seeds."""
    kinds = frozenset(r["held_out"] for r in runs if r.get("held_out")) or frozenset({"accuracy"})
    held, short, change = HEADERS[kinds]
    lines = [f"| algorithm | seed | {held} before RL | after RL | {change} | sampled reward (last 10 steps) | s/step |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    by_algo = defaultdict(list)
    for r in runs:
        by_algo[r["algorithm"]].append(r)
        lines.append(f"| {r['algorithm']} | {r['seed']} | {_held(r, 'before')} | {_held(r, 'after')} | "
                     f"{_fmt_gain(r, _gain(r))} | {_fmt(r['reward_last'])} | {_fmt(r['sec_per_step'])} |")
    if any(len(v) > 1 for v in by_algo.values()):
        lines += ["", f"| algorithm | seeds | mean {short} after RL | mean {change} | mean sampled reward |",
                  "| --- | --- | --- | --- | --- |"]
        for algo, rs in by_algo.items():
            done = [r for r in rs if _gain(r) is not None]
            if not done or len({r["held_out"] for r in done}) > 1:
                continue
            after = {**done[0], "after": sum(r["after"] for r in done) / len(done)}
            gain = sum(_gain(r) for r in done) / len(done)
            rew = sum(r["reward_last"] for r in done) / len(done)
            lines.append(f"| {algo} | {len(done)} | {_held(after, 'after')} | {_fmt_gain(after, gain)} | {rew:.3f} |")
    if len(kinds) > 1:
        lines += ["", MIXED_NOTE]
    if any(r["eta"] or r["offpolicy"]["|log pi_prox - log pi_behav|"] for r in runs):
        lines += ["", offpolicy_table(runs)]
    return "\n".join(lines) + "\n"


def offpolicy_table(runs: list[dict]) -> str:
    """Markdown: per label (mean over seeds), each off-policy metric's mean over the steps."""
    by_algo = defaultdict(list)
    for r in runs:
        by_algo[r["algorithm"]].append(r["offpolicy"])
    names = list(OFFPOLICY_KEYS)
    lines = ["| algorithm | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for algo, rows in by_algo.items():
        cells = []
        for n in names:
            vals = [x[n] for x in rows if x[n] is not None]
            cells.append(f"{sum(vals) / len(vals):.4g}" if vals else "-")
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: list[dict], path: str) -> str:
    """Reward curves, one line per algorithm (mean over seeds, moving average of 10 steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_algo = defaultdict(list)
    for r in runs:
        if r["curve"]:
            by_algo[r["algorithm"]].append(dict(r["curve"]))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for algo, curves in sorted(by_algo.items()):
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        mean = [sum(c[s] for c in curves) / len(curves) for s in steps]
        smooth = [sum(mean[max(0, i - 9): i + 1]) / len(mean[max(0, i - 9): i + 1]) for i in range(len(mean))]
        ax.plot(steps, smooth, label=f"{algo} (n={len(curves)})")
    ax.set(xlabel="step", ylabel="reward of sampled answers (moving avg of 10)", title="reward by algorithm")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summarize(sweep_dir: str) -> tuple[str, str | None]:
    """Write ``comparison.md`` and ``comparison.png`` into ``sweep_dir``; returns (table, png path)."""
    runs = collect(sweep_dir)
    md = table(runs)
    with open(os.path.join(sweep_dir, "comparison.md"), "w") as f:
        f.write(md)
    png = plot(runs, os.path.join(sweep_dir, "comparison.png")) if runs else None
    return md, png


class SweepSummary(Callback):
    """Hydra callback: summarise a ``-m`` sweep when it ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = config.hydra.sweep.dir
        if os.path.isdir(sweep_dir):
            md, png = summarize(sweep_dir)
            print(md)
            print(f"comparison written to {sweep_dir}/comparison.md and {png}")
