"""PNG learning curves of a run: training reward and held-out accuracy against the step."""

from __future__ import annotations

import os

from .logger import read_metrics


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(run_dir: str, title: str = "") -> str:
    """Write ``curves.png`` next to ``metrics.jsonl``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    x, y = _series(records, "reward/task")
    axes[0].plot(x, y, lw=0.8, alpha=0.5, label="per step")
    if len(y) >= 10:
        k = max(5, len(y) // 20)
        smooth = [sum(y[max(0, i - k + 1): i + 1]) / len(y[max(0, i - k + 1): i + 1]) for i in range(len(y))]
        axes[0].plot(x, smooth, lw=1.8, label=f"mean of {k}")
    axes[0].set(title="training reward (sampled)", xlabel="step", ylabel="reward")
    axes[0].legend(loc="lower right")
    for key, label in (("eval/accuracy", "pass@1"), ("eval/pass@k", "pass@k")):
        x, y = _series(records, key)
        if x:
            axes[1].plot(x, y, marker="o", label=label)
    axes[1].set(title="held-out accuracy", xlabel="step", ylabel="accuracy", ylim=(0, 1))
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(loc="lower right")
    else:  # a run without evaluation: say so instead of an empty legend
        axes[1].text(0.5, 0.5, "no evaluation in this run", ha="center", va="center", transform=axes[1].transAxes)
    fig.suptitle(title)
    fig.tight_layout()
    path = os.path.join(run_dir, "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
