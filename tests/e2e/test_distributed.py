"""Two gloo processes launched by ``accelerate launch`` compute the same loss, advantages and
update as one process on the same global batch (batch-level normalisation, the global token-mean
normaliser and the gradient all-reduce included); a two-process CLI run writes one metrics file."""

import json
import os
import subprocess
import sys

import torch

from .helpers import ROOT, cli_env

WORKER = os.path.join(os.path.dirname(__file__), "dist_check.py")
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def _run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_two_processes_equal_one(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    _run([sys.executable, WORKER, str(tmp_path / "one")], ROOT)
    _run([*LAUNCH, WORKER, str(tmp_path / "two")], ROOT)
    one = torch.load(tmp_path / "one" / "rank0.pt")
    r0, r1 = (torch.load(tmp_path / "two" / f"rank{r}.pt") for r in (0, 1))
    assert (r0["rank"], r1["rank"]) == (0, 1)
    torch.testing.assert_close(r0["loss"], one["loss"], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(r0["delta"], one["delta"], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(r1["delta"], r0["delta"], atol=0, rtol=0)  # identical steps on every rank
    n = r0["advantages"].shape[0]
    for part, got in ((slice(0, n), r0), (slice(n, 2 * n), r1)):
        width = got["advantages"].shape[1]
        torch.testing.assert_close(got["advantages"] * got["loss_mask"],
                                   one["advantages"][part, :width] * one["loss_mask"][part, :width],
                                   atol=1e-5, rtol=1e-5)


def test_two_process_cli_run(tmp_path):
    _run([*LAUNCH, "-m", "areal_trainer", "--config-name", "grpo", "+scale=tiny", "total_train_steps=2",
          "train_dataset.batch_size=4", "trial_name=ddp"], tmp_path)
    with open(tmp_path / "outputs" / "grpo" / "ddp" / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    steps = [r for r in records if "reward/task" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/rows"] == 8 for r in steps)  # 4 prompts x 2 samples, split over 2 processes


def test_two_process_asynchronous_run(tmp_path):
    """One rollout thread per process, admission per process: both keep the staleness bound and
    together train every prompt of an epoch once."""
    _run([*LAUNCH, "-m", "areal_trainer", "--config-name", "grpo", "+scale=tiny", "rollout.max_head_offpolicyness=1",
          "train_dataset.batch_size=4", "train_dataset.max_rows=16", "total_train_steps=4", "trial_name=adp"], tmp_path)
    with open(tmp_path / "outputs" / "grpo" / "adp" / "metrics.jsonl") as f:
        steps = [r for r in map(json.loads, f) if "reward/task" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["rollout/rows"] == 8 and r["actor/staleness/max"] <= 1 for r in steps)
    assert sorted(i for r in steps for i in r["data/prompt_ids"]) == list(range(16))
