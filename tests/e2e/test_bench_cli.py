"""scripts/bench_cli.py --quick times every case once and prints every row of its table (timings are not
checked: they depend on the machine and its load)."""

import os
import subprocess
import sys

from .helpers import ROOT, cli_env

ROWS = ("--help", "--help actor.eps_clip", "typo", "bad value", "missing plugin", "loss rule (needs torch)",
        "full start, 1 step")


def test_bench_cli_quick_prints_every_row(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_cli.py"), "--quick"], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("bench_cli ") and ", commit " in lines[0] and " CPUs, python " in lines[0]
    assert lines[1].split("|")[0].strip() == "case" and lines[1].endswith("<= 1.5 s")
    rows = {cells[0]: cells for line in lines[2:] if len(cells := [c.strip() for c in line.split("|")]) == 7}
    assert list(rows) == list(ROWS)
    for name, cells in rows.items():
        assert cells[4] == "1" and cells[5].endswith("x"), cells  # one run each; the ratio to the full start
        assert cells[6] in (("yes", "NO") if name in ROWS[:5] else ("-",)), cells
    assert rows["full start, 1 step"][5] == "1.000x"
    assert lines[-1].startswith("target: ") and "of 5 cases answered before torch loads within 1.5 s" in lines[-1]
