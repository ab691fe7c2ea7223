"""Summarise the off-policy ablation (corrections x eta x seeds) as one grid and one plot:
``python examples/offpolicy/grid.py <sweep dir> [--seed N]``.

Reads every run of the sweep (``metrics.jsonl`` and ``.hydra/config.yaml``), groups them by the
correction (``algorithm``) and ``rollout.max_head_offpolicyness``, and writes into the sweep
directory ``grid.md`` (mean held-out accuracy after RL, its change, the sampled reward of the last
10 steps and the mean staleness, per cell; the mean over seeds) and ``grid.png`` (accuracy after RL
against eta, one line per correction, every seed drawn as a dot).
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

from areal_trainer.tracking.sweep import collect


def cells(runs: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """``(correction, eta) -> runs``; the label's ``η=...`` suffix is dropped, eta is its own axis."""
    out = defaultdict(list)
    for r in runs:
        out[(r["algorithm"].split(" ")[0], r["eta"])].append(r)
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def grid(runs: list[dict]) -> str:
    by_cell = cells(runs)
    corrections = sorted({c for c, _ in by_cell}, key=lambda c: [k[0] for k in by_cell].index(c))
    etas = sorted({e for _, e in by_cell})
    head = "| correction | " + " | ".join(f"η={e}" for e in etas) + " |"
    rule = "| --- |" + " --- |" * len(etas)
    n_max = max(len([r for r in rs if r["acc_after"] is not None]) for rs in by_cell.values())
    blocks = []  # a cell with fewer seeds than the fullest one says how many it has
    for title, fn in (
        ("held-out accuracy after RL (mean over seeds; change in points)",
         lambda rs: f"{100 * _mean([r['acc_after'] for r in rs]):.1f}% "
                    f"({_mean([100 * (r['acc_after'] - r['acc_before']) for r in rs]):+.1f})"),
        ("sampled reward, last 10 steps", lambda rs: f"{_mean([r['reward_last'] for r in rs]):.3f}"),
        ("mean staleness of the trained tokens (versions)",
         lambda rs: f"{_mean([r['offpolicy']['staleness'] or 0.0 for r in rs]):.2f}"),
        ("mean |log π_prox − log π_behav| per token",
         lambda rs: "-" if any(r["offpolicy"]["|log pi_prox - log pi_behav|"] is None for r in rs)
         else f"{_mean([r['offpolicy']['|log pi_prox - log pi_behav|'] for r in rs]):.4f}"),
        ("masked fraction of tokens", lambda rs: "-" if any(r["offpolicy"]["masked frac"] is None for r in rs)
         else f"{_mean([r['offpolicy']['masked frac'] for r in rs]):.4f}"),
    ):
        lines = [f"**{title}**", "", head, rule]
        for c in corrections:
            row = []
            for e in etas:
                rs = [r for r in by_cell.get((c, e), []) if r["acc_after"] is not None]
                row.append(fn(rs) + f" n={len(rs)}" * (title.startswith("held") and len(rs) != n_max) if rs else "-")
            lines.append(f"| {c} | " + " | ".join(row) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def plot(runs: list[dict], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_cell = cells(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, c in enumerate(dict.fromkeys(k[0] for k in by_cell)):
        etas = sorted(e for cc, e in by_cell if cc == c)
        done = {e: [r for r in by_cell[(c, e)] if r["acc_after"] is not None] for e in etas}
        etas = [e for e in etas if done[e]]
        x = [e + 0.12 * (i - 1.5) for e in etas]
        ax.plot(x, [100 * _mean([r["acc_after"] for r in done[e]]) for e in etas], marker="o", label=c)
        for xe, e in zip(x, etas):
            ax.scatter([xe] * len(done[e]), [100 * r["acc_after"] for r in done[e]], s=10, alpha=0.4,
                       color=ax.lines[-1].get_color())
    ax.set(xlabel="rollout.max_head_offpolicyness (η)", ylabel="held-out accuracy after RL (%)",
           title="off-policy corrections against staleness")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    args = sys.argv[1:]
    seed = None
    if len(args) == 3 and args[1] == "--seed":  # one seed only: cells where some seeds are missing stay comparable
        seed, args = int(args[2]), args[:1]
    if len(args) != 1:
        sys.exit(__doc__)
    runs = [r for r in collect(args[0]) if seed is None or r["seed"] == seed]
    suffix = "" if seed is None else f"_seed{seed}"
    md = grid(runs)
    with open(os.path.join(args[0], f"grid{suffix}.md"), "w") as f:
        f.write(md)
    print(md)
    print("plot:", plot(runs, os.path.join(args[0], f"grid{suffix}.png")))
