"""scripts/bench_advantage.py --quick runs both phases end to end: every row of both tables, the background
load it started gone after it, the targets' line (timings are not checked: they depend on the machine and
its load)."""

import os
import re
import subprocess
import sys

import pytest

from tests.e2e.helpers import ROOT, cli_env

CASES = ["token 1.0/1.0", "token 0.99/0.95", "turn 1.0/1.0", "turn 0.99/0.95"]


def rows(lines: list[str], header: int) -> list[list[str]]:
    """The four table rows after the phase line at ``header`` (and the column names after it)."""
    assert lines[header + 1].split()[:6] == ["S", "unit", "gamma/lam", "fast", "ms", "loop"], lines[header + 1]
    return [line.split() for line in lines[header + 2: header + 6]]


@pytest.mark.e2e
def test_bench_advantage_quick_prints_both_phases(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_advantage.py"), "--quick"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("bench_advantage ") and ", commit " in lines[0] and " CPUs (" in lines[0]
    quiet = next(i for i, line in enumerate(lines) if line.startswith("quiet: the fast side on 1 intra-op thread"))
    busy = next(i for i, line in enumerate(lines) if line.startswith("busy: LOAD on every CPU (pid "))
    for header in (quiet, busy):
        table = rows(lines, header)
        assert [f"{r[1]} {r[2]}" for r in table] == CASES
        assert all(r[0] == "512" and r[5].endswith("x") for r in table), table
        assert all(r[-1 if header == quiet else 6] == "-" for r in table), table  # no target at B=8, S=512
    pid = int(re.search(r"\(pid (\d+), stopped", lines[busy]).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the load is stopped and reaped
    assert lines[-1] == "targets: not judged (they are set at B=64, S=8192)"
