"""Image-text-to-text models through the real command line, on the built-in tiny LLaVA (``builtin:tiny-vlm``) and
generated pictures in TRL's vision layout (a ``.jsonl`` file with PNG files beside it): GRPO with full fine-tuning
(the KL reference and evaluation seeing the images too) and with LoRA, PPO with a critic, each resuming from its
step-1 checkpoint to repeat step 2 exactly; the checkpoint holds the processor; samples.jsonl names each row's
images; on-policy distillation from a VLM teacher; every other preset in one sweep; asynchronous and lagged
generation; FSDP2 with two processes; a bad image input stops the run with one line before any model loads."""

import json
import math
import shutil
import subprocess
import sys

import yaml
from omegaconf import OmegaConf

from areal_trainer.data import pictures

from .. import golden
from .helpers import ROOT, cli, cli_env, comparable, step_records
from .test_agent_forms import _records

VLM = ["+scale=tiny", "actor.path=builtin:tiny-vlm", "allow_builtin_model_on_any_data=true", "saver.freq_steps=1",
       "reward.fn=tests.plugins.picture_reward", "actor.optimizer.lr=1e-2"]


def _data(tmp_path) -> list[str]:
    train = pictures.write_rows(str(tmp_path / "data"), "train", 8, size=16)
    test = pictures.write_rows(str(tmp_path / "data"), "test", 4, size=16)
    return [f"train_dataset.path={train}", f"valid_dataset.path={test}"]


def _finite_steps(run) -> dict[int, dict]:
    full = step_records(run, "reward/task")
    assert sorted(full) == [1, 2]
    for record in full.values():
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float)), record
    return full


def _resume_repeats_step_2(args, run, full, cwd) -> None:
    shutil.rmtree(run / "checkpoints" / "step_2")
    out = cli([*args, "recover.mode=auto"], cwd=cwd)
    assert f"resuming from {run / 'checkpoints' / 'step_1'} (step 1 of 2)" in out.stdout
    resumed = step_records(run, "reward/task")
    assert comparable(resumed[2]) == comparable(full[2])


def test_grpo_full_fine_tuning_with_a_kl_reference_and_exact_resume(tmp_path):
    args = ["--config-name", "grpo", *VLM, *_data(tmp_path), "actor.kl_ctl=0.01", "+ref.path=${actor.path}",
            "trial_name=full"]
    out = cli(args, cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "full"
    full = _finite_steps(run)
    assert full[1]["update/grad_norm"] > 0 and "eval/reward" in step_records(run, "eval/reward")[2]
    # The recomputed log-probs (the same images, the training forward) equal the engine's.
    assert full[1]["mismatch/abs_logp_diff/max"] < 1e-4
    assert "images:     pictures/test-0.png" in out.stdout and "<image>×16What colour" in out.stdout
    with open(run / "samples.jsonl") as f:
        first = json.loads(f.readline())
    assert first["images"][0].startswith("pictures/train-") and "<image>×16" in first["prompt"]
    actor = run / "checkpoints" / "step_2" / "actor"
    assert (actor / "processor_config.json").exists() and (actor / "chat_template.jinja").exists()
    _resume_repeats_step_2(args, run, full, tmp_path)


def test_grpo_with_lora_on_the_language_model_and_exact_resume(tmp_path):
    args = ["--config-name", "grpo", *VLM, *_data(tmp_path), "actor.use_lora=true", "actor.lora_rank=8",
            "trial_name=lora"]
    out = cli(args, cwd=tmp_path)
    assert "LoRA: " in out.stdout
    run = tmp_path / "outputs" / "grpo" / "lora"
    full = _finite_steps(run)
    config = json.loads((run / "checkpoints" / "step_2" / "actor" / "adapter_config.json").read_text())
    assert "language_model" in str(config["target_modules"])
    _resume_repeats_step_2(args, run, full, tmp_path)


def test_ppo_with_a_critic_on_image_rows_and_exact_resume(tmp_path):
    args = ["--config-name", "ppo", *VLM, *_data(tmp_path), "trial_name=ppo"]
    cli(args, cwd=tmp_path)
    run = tmp_path / "outputs" / "ppo" / "ppo"
    full = _finite_steps(run)
    assert "critic/update/grad_norm" in full[1]
    _resume_repeats_step_2(args, run, full, tmp_path)


def test_distillation_on_image_rows_scores_them_with_the_images_and_resumes_exactly(tmp_path):
    """Pure on-policy distillation from a VLM teacher of the student's family: the teacher is given each row's
    images (its log-probs in tests/train/test_teacher_images.py); the reverse KL is reported in training and on the
    held-out rows, and resuming repeats step 2 exactly."""
    args = ["--config-name", "distill", *VLM, *_data(tmp_path), "teacher.path=builtin:tiny-vlm", "trial_name=distill"]
    out = cli(args, cwd=tmp_path)
    run = tmp_path / "outputs" / "distill" / "distill"
    full = _finite_steps(run)
    assert all(r["distill/reverse_kl"] != 0 and r["distill/n_valid_tokens"] > 0 for r in full.values())
    assert "eval/distill/reverse_kl" in step_records(run, "eval/distill/reverse_kl")[2]
    assert "held-out reverse KL to the teacher" in out.stdout
    _resume_repeats_step_2(args, run, full, tmp_path)


def test_fsdp_two_processes_train_on_image_rows(tmp_path):
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--fsdp_version", "2",
              "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd = [*launch, "-m", "areal_trainer", "--config-name", "grpo", *VLM, *_data(tmp_path), "parallel.fsdp=true",
           "train_dataset.batch_size=4", "trial_name=fsdp"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = _finite_steps(tmp_path / "outputs" / "grpo" / "fsdp")
    assert all(r["rollout/rows"] == 8 for r in steps.values())


def test_a_missing_image_stops_the_run_with_one_line_before_any_model_loads(tmp_path):
    data = _data(tmp_path)
    (tmp_path / "data" / "pictures" / "train-3.png").unlink()
    proc = cli(["--config-name", "grpo", *VLM, *data, "trial_name=bad"], cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "train-3.png" in x]
    assert "line 4 of 'train.jsonl': image 'pictures/train-3.png' does not exist" in line
    assert "train_dataset.bad_images=skip" in line
    assert not (tmp_path / "outputs" / "grpo" / "bad" / "metrics.jsonl").exists()


def test_image_rows_on_a_text_only_model_stop_the_run_before_any_model_loads(tmp_path):
    proc = cli(["--config-name", "grpo", *VLM, *_data(tmp_path), "actor.path=builtin:tiny", "trial_name=text"],
               cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "actor.path='builtin:tiny' is a text-only model (no vision tower, no image processor)" in proc.stderr


def test_every_preset_trains_on_image_rows(tmp_path):
    """The presets but distillation (its own test above), as one sweep: two steps of two minibatches each, so that
    ratios, clips, gates and masks move, and DAPO's dynamic sampling filters image rows."""
    algos = [a for a in golden.presets() if a != "distill"]
    cli(["-m", f"algo={','.join(algos)}", *VLM, *_data(tmp_path), "actor.ppo_n_minibatches=2",
         "hydra.sweep.dir=sweep", "saver.freq_steps=null"], cwd=tmp_path, timeout=900)
    for i, algo in enumerate(algos):
        steps = _finite_steps(tmp_path / "sweep" / f"{i}-{algo}-seed1")
        assert all(r.get("update/skipped_steps", 0) == 0 and r["update/grad_norm"] > 0 for r in steps.values()), algo
        assert all(r["rollout/rows"] > 0 for r in steps.values()), algo
        if algo == "ppo":
            assert "critic/value_loss" in steps[2]


def test_asynchronous_training_samples_image_prompts_within_the_staleness_bound(tmp_path):
    """Generation in its own thread, one version ahead at most, on image rows."""
    args = ["--config-name", "grpo", *VLM, *_data(tmp_path), "rollout.max_head_offpolicyness=1",
            "total_train_steps=3", "saver.freq_steps=null", "trial_name=async"]
    cli(args, cwd=tmp_path)
    steps = step_records(tmp_path / "outputs" / "grpo" / "async", "reward/task")
    assert sorted(steps) == [1, 2, 3]
    assert all(math.isfinite(r["update/grad_norm"]) and r["actor/staleness/max"] <= 1 for r in steps.values())


def test_the_lagged_mode_samples_image_prompts_reproducibly(tmp_path):
    """Lagging snapshots, switching inside answers: two runs with one seed give the same steps."""
    args = ["--config-name", "grpo", *VLM, *_data(tmp_path), "rollout.max_head_offpolicyness=1",
            "rollout.offpolicy_mode=lagged", "rollout.lagged_switch_prob=0.5", "saver.freq_steps=null"]
    runs = []
    for trial in ("a", "b"):
        cli([*args, f"trial_name={trial}"], cwd=tmp_path)
        runs.append(_finite_steps(tmp_path / "outputs" / "grpo" / trial))
    assert [comparable(r) for r in runs[0].values()] == [comparable(r) for r in runs[1].values()]
    assert max(r["actor/staleness/max"] for r in runs[0].values()) == 1


def test_image_rows_with_a_text_only_workflow_stop_the_run_before_any_model_loads(tmp_path):
    workflow = "areal_trainer.rollout.agents.multi_turn.MultiTurnWorkflow"
    proc = cli(["--config-name", "grpo", *VLM, *_data(tmp_path), f"rollout.workflow={workflow}",
                "trial_name=workflow"], cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"rollout.workflow='{workflow}': this workflow samples text prompts only, and line 1 of " \
           "'train.jsonl' has images." in proc.stderr


AGENT_FORMS = {"in_process": "tests.agents.two_forms.run_client", "http": "tests.agents.two_forms.HTTP"}


def test_an_agent_sends_the_rows_pictures_in_process_and_over_http_and_both_train_alike(tmp_path):
    """An ``openai``-package agent that sends the row's messages on (the pictures as ``image_url`` data URLs), with
    the trainer's client and over the HTTP endpoint with its own ``openai.AsyncOpenAI``: both forms sample with
    the images (the recomputed log-probs, which see the row's pixels, equal the engine's), and in the lagged mode
    with one seed they log the same metrics at every step, held-out evaluation included."""
    runs = {}
    for name, agent in AGENT_FORMS.items():
        args = ["--config-name", "grpo", *VLM, *_data(tmp_path), f"rollout.agent={agent}",
                "+rollout.agent_kwargs.task=picture", "actor.recompute_logprob=true", "saver.freq_steps=null",
                "rollout.max_head_offpolicyness=1", "rollout.offpolicy_mode=lagged", "evaluator.freq_steps=2",
                f"trial_name={name}"]
        cli(args, cwd=tmp_path)
        runs[name] = _records(tmp_path / "outputs" / "grpo" / name)
    local, http = runs["in_process"], runs["http"]
    assert local == http
    steps = [r for r in local if "agent/calls" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["agent/calls"] == r["agent/episodes"] > 0 and r["agent/bad_requests"] == 0 for r in steps)
    assert all(r["mismatch/abs_logp_diff/max"] < 1e-4 for r in steps)
    assert [r["step"] for r in local if "eval/agent/episodes" in r] == [0, 2]


def test_the_example_config_composes_with_its_recipe(tmp_path):
    """examples/vlm/README.md's recipe: a warm start of 4 steps of 32 rows, then 8 pictures x 4 answers, the vision
    encoder frozen, synchronous without the recompute (the engine's log-probs are the policy's)."""
    args = ["--config-dir", f"{ROOT}/examples/vlm", "--config-name", "smollm2_vlm", "--cfg", "job"]
    cfg = OmegaConf.create(yaml.safe_load(cli(args, cwd=tmp_path).stdout))
    recipe = {"total_train_steps": 40, "gconfig.n_samples": 4, "train_dataset.batch_size": 8,
              "sft_warmup.steps": 4, "sft_warmup.batch_size": 32, "sft_warmup.lr": 5e-5,
              "actor.freeze_vision": True, "actor.recompute_logprob": False, "actor.use_decoupled_loss": False,
              "actor.rejection_sampling": None, "reward.fn": "areal_trainer.reward.words.first_word_reward"}
    for key, value in recipe.items():
        assert OmegaConf.select(cfg, key) == value, (key, OmegaConf.select(cfg, key))
