"""scripts/bench_agents.py --quick runs its three measurements end to end and prints every row of its tables
(timings are not checked: they depend on the machine and its load)."""

import os
import subprocess
import sys

from .helpers import ROOT, cli_env


def test_bench_agents_quick_prints_every_table(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_agents.py"), "--quick"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.strip() for line in proc.stdout.splitlines()]
    assert lines[0].startswith("bench_agents ") and " commit " in lines[0]
    assert lines[1].startswith("settings: latency 0.2 s, 3 calls per episode, quick sizes")
    for row in ("sequential", "concurrent", "sync", "eta=2"):
        assert any(line.startswith(f"{row} ") and line.count("|") >= 6 for line in lines), row
    assert any(line.startswith("concurrent / sequential: ") and "x episodes/s" in line for line in lines)
    assert any(line.startswith("eta=2 / sync: ") and "x steps/s" in line for line in lines)
    for row in ("in-process", "HTTP", "HTTP, 2 agent processes", "HTTP, client per episode",
                "HTTP, JSON without openai"):
        assert any(line.startswith(f"{row} ") and line.count("|") == 4 for line in lines), row
    assert "the 6 runs sampled the same rows (calls, tokens, rewards at every step)" in lines
    assert any(line.startswith("HTTP in 2 agent processes / in-process: ") and "x s/step" in line
               and "on the trainer's loop: " in line for line in lines)
    assert any(line.startswith("without the openai package (JSON posted with aiohttp): ") for line in lines)
