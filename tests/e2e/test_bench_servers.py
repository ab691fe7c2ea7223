"""scripts/bench_servers.py --quick (the hf engine) runs its four settings end to end and prints its table and its
three comparisons (timings are not checked: they depend on the machine and its load)."""

import os
import subprocess
import sys

from .helpers import ROOT, cli_env


def test_bench_servers_quick_prints_its_table_and_comparisons(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_servers.py"), "--engine", "hf",
                           "--quick"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.strip() for line in proc.stdout.splitlines()]
    assert lines[0].startswith("bench_servers ") and " commit " in lines[0] and "engine hf" in lines[0]
    for row in ("colocated hf", "hf:d1p1t1 disk", "hf:d1p1t1 xccl", "hf:d1p1t1 async"):
        assert any(line.startswith(f"{row} ") and line.count("|") == 4 for line in lines), row
    assert any(line.startswith("one server / colocated: ") and "target <= 1.2x" in line for line in lines)
    assert any(line.startswith("weight update: disk ") and "xccl" in line for line in lines)
    assert any(line.startswith("one server, async (eta=1) / sync: ") for line in lines)
