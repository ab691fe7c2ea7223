"""Summarise a sweep directory: ``python scripts/compare_sweep.py outputs/multirun/<timestamp>``.

Writes ``comparison.md`` (held-out accuracy before/after RL, training reward, time per step, per
algorithm and seed) and ``comparison.png`` (every algorithm's reward curve) into the directory and
prints the table. The same summary is written automatically at the end of every ``-m`` sweep.
"""

import sys

from areal_trainer.tracking.sweep import summarize

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    md, png = summarize(sys.argv[1])
    print(md)
    print(f"plot: {png}")
