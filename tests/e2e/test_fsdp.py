"""FSDP2 (``parallel.fsdp=true``, through ``accelerate launch --use_fsdp --fsdp_version 2``): two gloo
processes with the policy sharded compute the same loss, gradient norm and update (parameters compared
in full) as one process on the same global batch, also when the ranks run different numbers of
micro-batches, and so do LoRA adapters on the sharded policy; a two-process CLI run writes its metrics
and full Hugging Face checkpoints (with LoRA: the adapters) and resumes from them."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from .helpers import ROOT, cli_env, comparable, step_records

WORKER = os.path.join(os.path.dirname(__file__), "dist_check.py")
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--fsdp_version", "2",
          "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
ARGS = ["-m", "areal_trainer", "--config-name", "grpo", "+scale=tiny", "train_dataset.batch_size=4",
        "saver.freq_steps=1", "trial_name=fsdp", "parallel.fsdp=true"]


def _run(cmd, cwd, timeout=300):
    """Run a launcher; on a timeout (a collective out of step hangs) kill it with its workers."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s (hung collective?)\n{err[-4000:]}") from None
    assert proc.returncode == 0, err[-4000:]


def _one_and_two(tmp_path, *flags) -> tuple[dict, dict, dict]:
    """The check run as one process and as two under FSDP2: one process's record, then each rank's."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    _run([sys.executable, WORKER, str(tmp_path / "one"), *flags], ROOT)
    _run([*LAUNCH, WORKER, str(tmp_path / "two"), *flags], ROOT)
    one = torch.load(tmp_path / "one" / "rank0.pt")
    r0, r1 = (torch.load(tmp_path / "two" / f"rank{r}.pt") for r in (0, 1))
    return one, r0, r1


def _same_update(one: dict, r0: dict, r1: dict) -> None:
    """Two processes took the one-process step: its loss, gradient norm and weight change (to about a float32
    ulp of the weights), with the same full weights on every rank."""
    torch.testing.assert_close(r0["loss"], one["loss"], atol=1e-6, rtol=1e-5)
    assert abs(r0["grad_norm"] - one["grad_norm"]) <= 1e-4 * one["grad_norm"] and r0["grad_norm"] == r1["grad_norm"]
    assert one["delta"].abs().max() > 1e-4
    torch.testing.assert_close(r0["delta"], one["delta"], atol=3e-7, rtol=1e-4)
    torch.testing.assert_close(r1["delta"], r0["delta"], atol=0, rtol=0)


def test_fsdp_two_processes_equal_one(tmp_path):
    one, r0, r1 = _one_and_two(tmp_path, "--fsdp")
    assert not one["fsdp"] and r0["fsdp"] and r1["fsdp"]
    assert r0["n_micro"] != r1["n_micro"]  # the padding of the shorter rank is exercised
    assert one["grad_norm"] > 0.005  # the clipping (at 0.005) is exercised
    _same_update(one, r0, r1)


@pytest.mark.parametrize("layout", ["sharded", "whole"])
def test_fsdp_distillation_two_processes_equal_one(tmp_path, layout):
    """Pure on-policy distillation under FSDP2: each process's teacher (sharded like the policy, or whole on
    every process with teacher.shard=false) scores its own rows exactly as one process scores them, and the
    reverse-KL update (its normaliser global over the processes) equals the single-process one."""
    one, r0, r1 = _one_and_two(tmp_path, "--fsdp", "--teacher", *(["--whole-teacher"] if layout == "whole" else []))
    assert r0["fsdp"] and r1["fsdp"] and r0["n_micro"] != r1["n_micro"]
    half = r0["teacher_logp"].shape[0]
    assert half * 2 == one["teacher_logp"].shape[0]
    mask = one["loss_mask"].bool()
    assert (one["teacher_logp"][mask] < 0).all() and (one["teacher_logp"][~mask] == 0).all()
    for rank, r in enumerate((r0, r1)):  # the rank's rows, scored by its own copy of the teacher
        mine, width = one["teacher_logp"][rank * half:(rank + 1) * half], r["teacher_logp"].shape[1]
        assert (mine[:, width:] == 0).all()  # the single process pads its wider batch
        torch.testing.assert_close(r["teacher_logp"], mine[:, :width], atol=1e-6, rtol=1e-5)
    assert (one["advantages"] == 0).all()  # pure distillation estimates no advantage
    assert one["metrics"]["distill/reverse_kl"] != 0
    _same_update(one, r0, r1)


def test_fsdp_lora_two_processes_equal_one(tmp_path):
    """LoRA under FSDP2: the adapters (attached before sharding) get the single-process update, the base
    stays frozen, and the adapter saved from the gathered full state dict equals the one-process one."""
    from safetensors.torch import load_file

    one, r0, r1 = _one_and_two(tmp_path, "--fsdp", "--lora")
    assert not one["fsdp"] and r0["fsdp"] and r1["fsdp"]
    assert r0["n_micro"] != r1["n_micro"]
    assert one["trainable"] == r0["trainable"] and all(".lora_" in n for n in one["trainable"])
    _same_update(one, r0, r1)
    adapter_one, adapter_two = (load_file(tmp_path / d / "adapter" / "adapter_model.safetensors")
                                for d in ("one", "two"))
    assert sorted(adapter_one) == sorted(adapter_two) and len(adapter_one) == len(one["trainable"])
    assert any(v.abs().max() > 0 for k, v in adapter_one.items() if ".lora_B." in k)  # the update is in it
    for k, v in adapter_one.items():
        torch.testing.assert_close(adapter_two[k], v, atol=3e-7, rtol=1e-4)
    base_one, base_two = (torch.load(tmp_path / d / "adapter" / "base_model.pt") for d in ("one", "two"))
    assert sorted(base_one) == sorted(base_two)
    assert all(torch.equal(base_two[k], v) for k, v in base_one.items())  # frozen: bit for bit
    merged_one, merged_two = (torch.load(tmp_path / d / "merged.pt") for d in ("one", "two"))
    assert sorted(merged_one) == sorted(base_one)  # the base model's names
    for k, v in merged_one.items():
        torch.testing.assert_close(merged_two[k], v, atol=1e-6, rtol=1e-5)


def test_fsdp_cli_run_checkpoint_and_resume(tmp_path):
    from transformers import AutoModelForCausalLM

    _run([*LAUNCH, *ARGS, "total_train_steps=2"], tmp_path)
    run = tmp_path / "outputs" / "grpo" / "fsdp"
    with open(run / "metrics.jsonl") as f:
        steps = [r for r in map(json.loads, f) if "reward/task" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/rows"] == 8 for r in steps)  # 4 prompts x 2 samples, split over 2 processes
    ckpt = run / "checkpoints" / "step_2"
    model = AutoModelForCausalLM.from_pretrained(ckpt / "actor")  # full weights, loadable without FSDP
    assert sum(p.numel() for p in model.parameters()) > 10**6
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert "model.embed_tokens.weight" in state["optimizer"]["state"]  # the full optimizer state

    _run([*LAUNCH, *ARGS, "total_train_steps=3", "recover.mode=auto"], tmp_path)
    with open(run / "metrics.jsonl") as f:
        assert [r["step"] for r in map(json.loads, f) if "reward/task" in r] == [1, 2, 3]
    assert (run / "checkpoints" / "step_3" / "COMPLETE").exists()


def test_fsdp_lora_cli_run_saves_adapters_and_resumes_exactly(tmp_path):
    """PPO with LoRA on the policy and the critic, sharded: checkpoints hold the adapters (gathered), the
    rollout copy samples with the merged weights, the KL reference is the base with the adapter off, and
    resuming from step 1 repeats step 2 exactly (every rank's RNG state restored)."""
    args = [*LAUNCH, "-m", "areal_trainer", "--config-name", "ppo", "+scale=tiny", "train_dataset.batch_size=4",
            "saver.freq_steps=1", "actor.use_lora=true", "actor.lora_rank=8", "critic.use_lora=true",
            "critic.lora_rank=8", "rollout.dtype=float32", "actor.optimizer.lr=1e-2", "actor.kl_ctl=0.01",
            "+ref.path=${actor.path}", "actor.mb_spec.max_tokens_per_mb=64",
            "reward.fn=tests.plugins.digit_share_reward", "trial_name=lora", "parallel.fsdp=true"]
    _run(args, tmp_path)
    run = tmp_path / "outputs" / "ppo" / "lora"

    def records():
        return {step: comparable(r) for step, r in step_records(run, "reward/task").items()}

    full = records()
    assert sorted(full) == [1, 2]
    assert full[2]["mismatch/abs_logp_diff/max"] < 1e-5  # the copy received base + B·A·scale
    # The reference is the base with the adapter off: equal to the policy before the first update only.
    assert abs(full[1]["advantage/kl_reward"]) < 1e-7 < 1e-6 < abs(full[2]["advantage/kl_reward"])
    for name in ("actor", "critic"):
        saved = run / "checkpoints" / "step_1" / name
        assert (saved / "adapter_model.safetensors").is_file() and (saved / "base_model.pt").is_file(), name
    assert (run / "checkpoints" / "step_1" / "critic" / "value_head.pt").is_file()
    state = torch.load(run / "checkpoints" / "step_1" / "trainer_state.pt", weights_only=False)
    assert state["optimizer"]["state"] and all(".lora_" in k for k in state["optimizer"]["state"])

    shutil.rmtree(run / "checkpoints" / "step_2")
    _run([*args, "recover.mode=auto"], tmp_path)
    assert records() == full


def test_fsdp_asynchronous_run(tmp_path):
    """The rollout thread's copy of the policy receives the full (gathered) weights after every step."""
    _run([*LAUNCH, "-m", "areal_trainer", "--config-name", "grpo", "+scale=tiny", "train_dataset.batch_size=4",
          "rollout.max_head_offpolicyness=1", "total_train_steps=3", "trial_name=afsdp", "parallel.fsdp=true"],
         tmp_path)
    with open(tmp_path / "outputs" / "grpo" / "afsdp" / "metrics.jsonl") as f:
        steps = [r for r in map(json.loads, f) if "reward/task" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["actor/staleness/max"] <= 1 for r in steps)


def test_weights_for_servers_are_gathered_tensor_by_tensor_and_a_retry_is_one_more_pass(tmp_path):
    """Under FSDP2 the weights pushed to inference servers are gathered one tensor at a time as they are sent
    (two read, two gathered), every process walks each pass the main one makes, and a push retried after a
    server went away mid-update starts a fresh pass that delivers the whole model, equal to a checkpoint's."""
    worker = os.path.join(os.path.dirname(__file__), "stream_check.py")
    _run([*LAUNCH, worker, str(tmp_path)], ROOT)
    got = torch.load(tmp_path / "stream.pt")
    assert got["sharded"] and got["attempts"] == [["a:1", "b:2"], ["b:2"]] and got["version"] == 1
    assert got["gathered_after_two"] == 2
    assert list(got["received"]) == list(got["full"])
    for name, tensor in got["full"].items():
        assert torch.equal(got["received"][name], tensor), name
    assert [torch.load(tmp_path / f"rank{r}.pt")["passes"] for r in (0, 1)] == [0, 2]
