"""PNG learning curves of a run against the step: the training reward (pure distillation: the reverse KL to
the teacher) and the held-out accuracy, or the held-out mean reward of a run without a verifier."""

from __future__ import annotations

import contextlib
import os
import warnings

from .logger import read_metrics
from .space import free_space


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def held_out_kind(records: list[dict]) -> str | None:
    """``accuracy`` when every evaluation reported one, ``reward`` when some did not (no verifier), None
    without evaluations: what a run's held-out curve (and its final line) may call itself."""
    evals = [r for r in records if "eval/accuracy" in r or "eval/reward" in r]
    if not evals:
        return None
    return "accuracy" if all("eval/accuracy" in r for r in evals) else "reward"


def _smoothed(ax, x: list[int], y: list[float], label: str = "per step") -> None:
    ax.plot(x, y, lw=0.8, alpha=0.5, label=label)
    if len(y) >= 10:
        k = max(5, len(y) // 20)
        smooth = [sum(y[max(0, i - k + 1): i + 1]) / len(y[max(0, i - k + 1): i + 1]) for i in range(len(y))]
        ax.plot(x, smooth, lw=1.8, label=f"mean of {k}")


def _training(ax, records: list[dict], distill: bool) -> None:
    """The left panel: the training reward, or (pure distillation) the reverse KL to the teacher, training
    and held-out."""
    if not distill:
        _smoothed(ax, *_series(records, "reward/task"))
        ax.set(title="training reward (sampled)", xlabel="step", ylabel="reward")
    else:
        _smoothed(ax, *_series(records, "distill/reverse_kl"), label="training, per step")
        x, y = _series(records, "eval/distill/reverse_kl")
        if x:
            ax.plot(x, y, marker="o", label="held-out")
        ax.set(title="reverse KL to the teacher", xlabel="step", ylabel="nats per answer token")
    ax.legend(loc="upper right" if distill else "lower right")


def _held_out(ax, records: list[dict], reward_label: str) -> None:
    """The right panel: held-out accuracy (pass@1, pass@k), or the held-out mean reward of a run without a
    verifier, named by ``reward_label``."""
    kind = held_out_kind(records)
    if kind == "accuracy":
        for key, label in (("eval/accuracy", "pass@1"), ("eval/pass@k", "pass@k")):
            x, y = _series(records, key)
            if x:
                ax.plot(x, y, marker="o", label=label)
        ax.set(title="held-out accuracy", xlabel="step", ylabel="accuracy", ylim=(0, 1))
        ax.legend(loc="lower right")
    elif kind == "reward":
        ax.plot(*_series(records, "eval/reward"), marker="o", label="mean reward")
        ax.set(title=f"held-out mean reward ({reward_label}; no verifier)", xlabel="step", ylabel="mean reward")
        ax.legend(loc="lower right")
    else:  # a run without evaluation: say so instead of an empty legend
        ax.set(title="held-out evaluation", xlabel="step")
        ax.text(0.5, 0.5, "no evaluation in this run", ha="center", va="center", transform=ax.transAxes)


def plot_run(run_dir: str, title: str = "", *, reward_label: str = "reward", distill: bool = False) -> str | None:
    """Write ``curves.png`` next to ``metrics.jsonl``; returns its path (None: not written, warned).
    ``reward_label``: what the reward is (named on a mean-reward panel); ``distill``: pure distillation (the
    left panel shows the reverse KL)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    _training(axes[0], records, distill)
    _held_out(axes[1], records, reward_label)
    fig.suptitle(title)
    fig.tight_layout()
    path = os.path.join(run_dir, "curves.png")
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:  # a full disk costs the picture only: one warning, nothing half-written left
        with contextlib.suppress(OSError):
            os.remove(path)
        warnings.warn(f"cannot write {path}: {type(e).__name__}: {' '.join(str(e).split())[:200]}. Free space there: "
                      f"{free_space(path)}; the plot needs about 0.1 MiB. The run's metrics are in metrics.jsonl.",
                      stacklevel=2)
        return None
    finally:
        plt.close(fig)
    return path
