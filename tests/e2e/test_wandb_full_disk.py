"""wandb's directory on a real full disk (a 160 KiB tmpfs mounted under the run directory, inside a user and mount
namespace of the test's own): the run goes on to its end with one warning line, no traceback, and every step in
metrics.jsonl. Skipped where the kernel refuses an unprivileged mount namespace."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from .helpers import HANG, cli_env

SCRIPT = """
set -e
mkdir -p "$RUN/wandb"
mount -t tmpfs -o size=160k tmpfs "$RUN/wandb"
exec "$PY" -m areal_trainer --config-name grpo +scale=tiny total_train_steps=20 saver.freq_steps=null \\
  evaluator.freq_steps=null stats_logger.progress_bar=false stats_logger.wandb.mode=offline \\
  stats_logger.samples_per_step=64 hydra.run.dir="$RUN"
"""


def _can_mount() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"no unprivileged mount namespace here: {probe.stderr.strip()}"


@pytest.mark.skipif(_can_mount() is not None, reason=str(_can_mount()))
def test_a_full_disk_under_wandb_is_one_warning_and_the_run_ends_normally(tmp_path):
    run = tmp_path / "run"
    env = cli_env({"RUN": str(run), "PY": sys.executable})
    env.pop("WANDB_MODE", None)  # wandb on, offline, writing into the small mount
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "wandb" in line.lower()]
    assert len(lines) == 1 and lines[0].startswith(f"warning: wandb cannot write to {run}/wandb/"), lines
    assert "No space left on device" in lines[0] and "metrics.jsonl keeps every step" in lines[0]
    assert "Traceback" not in proc.stderr and "Logging error" not in proc.stderr
    with open(run / "metrics.jsonl") as f:
        assert sorted(r["step"] for r in map(json.loads, f) if "time/step" in r) == list(range(1, 21))
