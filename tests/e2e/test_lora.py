"""LoRA from the command line. ``actor.use_lora``: a tiny run with the KL penalty against the adapter-free
base has finite metrics and adapter checkpoints, and resuming from step 1 repeats step 2 exactly.
``critic.use_lora`` (the ppo preset): the critic's checkpoint holds its adapter, value head and base, and
resuming repeats step 2 exactly. Unknown target modules fail before the warm start."""

import math
import shutil

from .helpers import cli, comparable, step_records

# A reward that varies between the answers of an untrained model, so the adapter does move; a rollout
# copy of the policy in float32 (it receives the merged weights); the KL penalty against the base.
ARGS = ["--config-name", "grpo", "+scale=tiny", "saver.freq_steps=1", "actor.use_lora=true", "actor.lora_rank=8",
        "actor.kl_ctl=0.01", "+ref.path=${actor.path}", "rollout.dtype=float32",
        "actor.optimizer.lr=1e-2", "reward.fn=tests.plugins.digit_share_reward", "trial_name=lora"]


def _records(run_dir):
    return step_records(run_dir, "reward/task")


def _two_finite_steps(run) -> dict[int, dict]:
    """The run's two step records, every value in them finite."""
    full = _records(run)
    assert sorted(full) == [1, 2]
    for record in full.values():
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float)), record
    return full


def _resuming_from_step_1_repeats_step_2(args, run, full, cwd) -> None:
    """Without step 2's checkpoint, a resume from step 1 trains step 2 again, exactly as before."""
    shutil.rmtree(run / "checkpoints" / "step_2")
    out = cli([*args, "recover.mode=auto"], cwd=cwd)
    assert f"resuming from {run / 'checkpoints' / 'step_1'} (step 1 of 2)" in out.stdout
    resumed = _records(run)
    assert sorted(resumed) == [1, 2]
    assert comparable(resumed[2]) == comparable(full[2])


def test_lora_run_is_finite_and_resumes_exactly(tmp_path):
    out = cli(ARGS, cwd=tmp_path)
    assert "LoRA: 94208 trainable of 1257600 parameters (7.49%)" in out.stdout
    run = tmp_path / "outputs" / "grpo" / "lora"
    full = _two_finite_steps(run)
    # The reference is the base with the adapter off: equal to the policy before the first update only.
    assert abs(full[1]["advantage/kl_reward"]) < 1e-7 < 1e-6 < abs(full[2]["advantage/kl_reward"])
    # The rollout copy samples with the updated adapter: its log-probs equal the policy's.
    assert full[2]["mismatch/abs_logp_diff/max"] < 1e-5
    actor = run / "checkpoints" / "step_1" / "actor"
    assert (actor / "adapter_config.json").is_file() and (actor / "adapter_model.safetensors").is_file()
    assert (actor / "base_model.pt").is_file()  # the warm start changed the base
    assert not (run / "checkpoints" / "step_1" / "ref").exists()  # the reference is the base: no copy

    _resuming_from_step_1_repeats_step_2(ARGS, run, full, tmp_path)


def test_unknown_target_module_fails_before_the_warm_start(tmp_path):
    out = cli(["--config-name", "grpo", "+scale=tiny", "actor.use_lora=true", "actor.target_modules=[q_proj,qkv_proj]"],
              cwd=tmp_path, check=False)
    assert out.returncode != 0
    assert ("actor.target_modules: ['qkv_proj'] not found in 'builtin:tiny'; its Linear layers are"
            in out.stderr + out.stdout)
    assert "SFT" not in out.stderr + out.stdout


# The ppo preset with LoRA on the critic only (the policy trains fully).
CRITIC_ARGS = ["--config-name", "ppo", "+scale=tiny", "saver.freq_steps=1", "critic.use_lora=true",
               "critic.lora_rank=8", "trial_name=critic_lora"]


def test_critic_lora_run_saves_adapter_and_head_and_resumes_exactly(tmp_path):
    out = cli(CRITIC_ARGS, cwd=tmp_path)
    # the actor's 94208 adapter parameters on the same backbone, and the 129 of the value head
    assert "critic LoRA: 94337 trainable of 1257729 parameters (7.50%)" in out.stdout
    run = tmp_path / "outputs" / "ppo" / "critic_lora"
    full = _two_finite_steps(run)
    assert full[2]["critic/update/grad_norm"] > 0
    critic = run / "checkpoints" / "step_1" / "critic"
    assert sorted(p.name for p in critic.iterdir() if not p.name.startswith(("tokenizer", "chat_template"))) == \
        ["README.md", "adapter_config.json", "adapter_model.safetensors", "base_model.pt", "lora_base.json",
         "value_head.pt"]  # base_model.pt: copied from the warm-started policy
    assert (run / "checkpoints" / "step_1" / "actor" / "model.safetensors").is_file()  # the policy: full weights

    _resuming_from_step_1_repeats_step_2(CRITIC_ARGS, run, full, tmp_path)


def test_unknown_critic_target_module_fails_before_the_warm_start(tmp_path):
    out = cli(["--config-name", "ppo", "+scale=tiny", "critic.use_lora=true", "critic.target_modules=[qkv_proj]"],
              cwd=tmp_path, check=False)
    assert out.returncode == 1
    assert "critic.target_modules: ['qkv_proj'] not found in 'builtin:tiny'; its Linear layers are" in out.stderr
    assert "SFT" not in out.stderr + out.stdout
    assert not (tmp_path / "outputs").exists()
