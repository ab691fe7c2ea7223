"""The GPU check script runs end to end on CPU at a tiny shape and writes its report."""

import json
import subprocess
import sys

from .helpers import ROOT, cli_env


def test_gpu_check_script_cpu_smoke(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--shape", "tiny", "--steps", "2", "--prompts", "2",
                           "--samples", "2", "--max-new-tokens", "8", "--etas", "0,1", "--out", str(out)],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["steps"] == 2 and report["parameters"] > 0
    for key in ("step_time_s", "tokens_per_s", "update_tokens_per_s", "generated_tokens_per_s"):
        assert report[key] > 0
    assert set(report["settings"]) == {"0", "1"} and report["settings"]["1"]["max_staleness"] <= 1
    assert report["steps_per_s_vs_sync"]["1"] > 0
    shared, unshared = report["settings"]["0"], report["unshared_sync"]
    assert unshared["update_tokens_computed"] == unshared["update_tokens"]  # every row in full
    assert shared["update_tokens_computed"] < shared["update_tokens"]  # a prompt's samples share it
    assert report["shared_vs_unshared"]["update_time_s"] > 0


def test_gpu_check_script_with_lora_cpu_smoke(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--shape", "tiny", "--steps", "2", "--prompts", "2",
                           "--samples", "2", "--max-new-tokens", "8", "--etas", "0", "--no-unshared", "--lora",
                           "--out", str(out)], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["lora"] is True and report["steps"] == 2 and report["update_time_s"] > 0
    assert "LoRA" in proc.stdout and "unshared_sync" not in report


def test_gpu_check_script_on_an_inference_server_cpu_smoke(tmp_path):
    """The server mode (GPU_CHECK_BACKEND): the report carries the trainer's telemetry per setting."""
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--shape", "tiny", "--steps", "2", "--prompts", "2",
                           "--samples", "2", "--max-new-tokens", "8", "--etas", "0", "--no-unshared",
                           "--backend", "hf:d1p1t1", "--weight-update-mode", "xccl", "--out", str(out)], cwd=ROOT,
                          env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["backend"] == "hf:d1p1t1" and report["weight_update_mode"] == "xccl"
    for key in ("gen_tokens_per_s", "train_tokens_per_s", "tflops", "weight_update_s"):
        assert report[key] > 0, key
    assert report["mfu"] is None  # no known peak on a CPU
    assert set(report["time_split_s"]) >= {"rollout", "logprobs", "update", "weight_push"}
