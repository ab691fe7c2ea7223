"""Summarise the distillation comparison: ``python examples/distill/compare.py <sweep dir> <teacher run dir>
[--out <dir>]``.

Reads every run of the sweep (``metrics.jsonl`` and ``.hydra/config.yaml``; the arm is the run's
``algorithm``) and the teacher's own run, and writes into ``--out`` (default: the sweep directory, beside
the sweep's own ``comparison.md``)
``distillation.md`` (held-out accuracy at every evaluation, mean over seeds with the range; training
time, s/step and the teacher's share of it; the reverse KL to the teacher between evaluations; every
run's before/after) and ``distillation.png`` (held-out accuracy against steps and against training
time, the mean of each arm as a line and every run as faint dots, the teacher's accuracy as a dashed
line; and the reverse KL to the teacher against steps).

Training time is the sum of ``time/step`` up to a step: rollout, teacher, update; not the evaluations
and not the warm start, which are the same in every arm.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict

import yaml

from areal_trainer.tracking.logger import read_metrics

ORDER = ("grpo", "distill", "grpo_distill", "grpo_distill_joint")
NAMES = {"grpo": "RL alone (GRPO)", "distill": "pure distillation", "grpo_distill": "RL + distillation (advantage)",
         "grpo_distill_joint": "RL + distillation (joint, AReaL)"}


def read_run(run_dir: str) -> dict | None:
    """A run's arm, seed, held-out accuracy by step and cumulative training seconds by step."""
    cfg_path, metrics = os.path.join(run_dir, ".hydra", "config.yaml"), os.path.join(run_dir, "metrics.jsonl")
    if not (os.path.isfile(cfg_path) and os.path.isfile(metrics)):
        return None
    with open(cfg_path) as f:
        cfg = yaml.safe_load(f)
    acc, seconds, teacher, kl = {}, {0: 0.0}, [], {}
    total = 0.0
    for r in read_metrics(metrics):
        if "eval/accuracy" in r:
            acc[r["step"]] = r["eval/accuracy"]
        if "time/step" in r:
            total += r["time/step"]
            seconds[r["step"]] = total
            teacher.append(r.get("time/teacher", 0.0))
            if "distill/reverse_kl" in r:
                kl[r["step"]] = r["distill/reverse_kl"]
    return {"arm": cfg["algorithm"], "seed": cfg["seed"], "acc": acc, "seconds": seconds,
            "n_eval": (cfg.get("valid_dataset") or {}).get("max_rows"),
            "teacher_s": sum(teacher) / len(teacher) if teacher else 0.0, "steps": len(teacher), "kl": kl}


def read_sweep(sweep_dir: str) -> dict[str, list[dict]]:
    arms = defaultdict(list)
    for name in sorted(os.listdir(sweep_dir)):
        run = read_run(os.path.join(sweep_dir, name))
        if run is not None and run["acc"]:
            arms[run["arm"]].append(run)
    return {a: sorted(arms[a], key=lambda r: r["seed"]) for a in sorted(arms, key=_order)}


def _order(arm: str):
    return (ORDER.index(arm), arm) if arm in ORDER else (len(ORDER), arm)


def _mean(xs):
    return sum(xs) / len(xs)


def teacher_accuracy(teacher_dir: str) -> tuple[int, float]:
    """The teacher run's last evaluation: (its step, its held-out accuracy)."""
    run = read_run(teacher_dir)
    step = max(run["acc"])
    return step, run["acc"][step]


def table(arms: dict[str, list[dict]], teacher: tuple[int, float]) -> str:
    steps = sorted(set.intersection(*(set(r["acc"]) for rs in arms.values() for r in rs)))
    n_eval = next(iter(arms.values()))[0]["n_eval"]
    lines = [f"Teacher: {100 * teacher[1]:.1f}% held-out accuracy (its run's evaluation at step {teacher[0]}).", "",
             f"**Held-out accuracy by step** (greedy pass@1 on the {n_eval} held-out problems; mean over seeds, "
             "range in brackets)",
             "", "| arm | seeds | " + " | ".join(f"step {s}" for s in steps) + " |",
             "| --- | --- |" + " --- |" * len(steps)]
    for arm, rs in arms.items():
        cells = []
        for s in steps:
            vals = [100 * r["acc"][s] for r in rs]
            cells.append(f"{_mean(vals):.1f}% [{min(vals):.1f}–{max(vals):.1f}]")
        lines.append(f"| {NAMES.get(arm, arm)} | {len(rs)} | " + " | ".join(cells) + " |")
    last = steps[-1]
    lines += ["", f"**Cost** (training time to step {last}: rollout, teacher and update; evaluations excluded)", "",
              "| arm | change to step " + str(last) + " (points) | training time (s) | s/step | teacher s/step |",
              "| --- | --- | --- | --- | --- |"]
    for arm, rs in arms.items():
        change = _mean([100 * (r["acc"][last] - r["acc"][0]) for r in rs])
        secs = _mean([r["seconds"][last] for r in rs])
        lines.append(f"| {NAMES.get(arm, arm)} | {change:+.1f} | {secs:.1f} | {secs / last:.2f} | "
                     f"{_mean([r['teacher_s'] for r in rs]):.2f} |")
    lines += kl_table(arms, steps)
    lines += ["", "**Every run**", "", "| arm | seed | before | after | training time (s) |",
              "| --- | --- | --- | --- | --- |"]
    for arm, rs in arms.items():
        for r in rs:
            lines.append(f"| {NAMES.get(arm, arm)} | {r['seed']} | {100 * r['acc'][0]:.1f}% | "
                         f"{100 * r['acc'][last]:.1f}% | {r['seconds'][last]:.1f} |")
    return "\n".join(lines) + "\n"


def _window_kl(run: dict, lo: int, hi: int) -> float | None:
    vals = [v for s, v in run["kl"].items() if lo < s <= hi]
    return _mean(vals) if vals else None


def kl_table(arms: dict[str, list[dict]], steps: list[int]) -> list[str]:
    """The reverse KL to the teacher (``distill/reverse_kl``, on the sampled answers) between evaluations,
    for the arms that score with the teacher."""
    windows = list(zip(steps, steps[1:]))
    rows = []
    for arm, rs in arms.items():
        cells = [[k for r in rs if (k := _window_kl(r, lo, hi)) is not None] for lo, hi in windows]
        if all(cells):
            rows.append(f"| {NAMES.get(arm, arm)} | " + " | ".join(f"{_mean(c):.3f}" for c in cells) + " |")
    if not rows:
        return []
    return ["", "**Reverse KL to the teacher** (mean log π_θ − log π_T per trained token of the sampled answers, "
            "over the steps between evaluations; mean over seeds)", "",
            "| arm | " + " | ".join(f"steps {lo + 1}–{hi}" for lo, hi in windows) + " |",
            "| --- |" + " --- |" * len(windows), *rows]


def plot(arms: dict[str, list[dict]], teacher: tuple[int, float], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    axes[1].sharey(axes[0])
    for i, (arm, rs) in enumerate(arms.items()):
        color = f"C{i}"
        steps = sorted(set.intersection(*(set(r["acc"]) for r in rs)))
        mean_acc = [100 * _mean([r["acc"][s] for r in rs]) for s in steps]
        mean_sec = [_mean([r["seconds"][s] for r in rs]) for s in steps]
        for ax, xs in ((axes[0], steps), (axes[1], mean_sec)):
            ax.plot(xs, mean_acc, "-o", color=color, ms=3, label=f"{NAMES.get(arm, arm)} (n={len(rs)})")
        for r in rs:
            axes[0].plot(steps, [100 * r["acc"][s] for s in steps], ".", color=color, alpha=0.3)
            axes[1].plot([r["seconds"][s] for s in steps], [100 * r["acc"][s] for s in steps], ".", color=color,
                         alpha=0.3)
        if all(r["kl"] for r in rs):  # the arms that score with the teacher: moving average of 10 steps
            common = sorted(set.intersection(*(set(r["kl"]) for r in rs)))
            mean_kl = [_mean([r["kl"][s] for r in rs]) for s in common]
            smooth = [_mean(mean_kl[max(0, i - 9): i + 1]) for i in range(len(mean_kl))]
            axes[2].plot(common, smooth, color=color, label=NAMES.get(arm, arm))
    for ax in axes[:2]:
        ax.axhline(100 * teacher[1], color="gray", ls="--", lw=1, label="teacher")
        ax.grid(alpha=0.3)
    axes[0].set(xlabel="RL step", ylabel="held-out accuracy (%)", title="accuracy against steps")
    axes[1].set(xlabel="training time (s, evaluations excluded)", title="accuracy against training time")
    axes[2].set(xlabel="RL step", ylabel="nats per trained token", title="reverse KL to the teacher (moving avg of 10)")
    axes[2].grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("teacher_dir")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    out = a.out or a.sweep_dir
    arms = read_sweep(a.sweep_dir)
    if not arms:
        raise SystemExit(f"no finished runs under {a.sweep_dir}")
    teacher = teacher_accuracy(a.teacher_dir)
    md = table(arms, teacher)
    with open(os.path.join(out, "distillation.md"), "w") as f:
        f.write(md)
    print(md)
    print("plot:", plot(arms, teacher, os.path.join(out, "distillation.png")))


if __name__ == "__main__":
    main()
