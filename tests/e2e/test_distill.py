"""On-policy distillation through the real command line, with a teacher made here (a 2-step GRPO run's
checkpoint): the ``distill`` preset (pure distillation calls no reward function), RL plus distillation in
both single-teacher forms, MOPD with two teachers routed by a dataset column, a resume that equals the
uninterrupted run (and refuses another teacher), an asynchronous run (eta = 2), and the bad teachers
reported before any model loads."""

import json
import shutil

import pytest

from areal_trainer.data import arith

from .helpers import cli, comparable, step_records

TINY = ["+scale=tiny", "valid_dataset=null", "evaluator.eval_before_train=false"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A checkpoint of this trainer: 2 GRPO steps on the built-in task, from another seed than the students'
    (the same seed and warm start would give a teacher equal to the student)."""
    cwd = tmp_path_factory.mktemp("teacher")
    cli(["--config-name", "grpo", *TINY, "seed=7", "reward.fn=tests.plugins.digit_share_reward",
         "actor.optimizer.lr=1e-2", "trial_name=t"], cwd=cwd)
    return str(cwd / "outputs" / "grpo" / "t" / "checkpoints" / "step_2")


def test_distill_preset_with_a_checkpoint_teacher_calls_no_reward(tmp_path, teacher):
    out = cli(["--config-name", "distill", *TINY, f"teacher.path={teacher}", "trial_name=d",
               "reward.fn=tests.plugins.never_called_reward"], cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "distill" / "d")
    assert sorted(records) == [1, 2], out.stderr[-2000:]
    for r in records.values():
        assert r["reward/errors"] == 0 and r["reward/task"] == 0  # no reward function ran
        assert r["distill/n_valid_tokens"] > 0 and r["time/teacher"] > 0
        for k in ("distill/reverse_kl", "distill/teacher_logp", "distill/token_loss", "actor/entropy"):
            assert k in r, k
        assert r["advantage/abs_mean"] == 0  # no advantage was estimated
    assert records[2]["distill/reverse_kl"] != records[1]["distill/reverse_kl"]  # the student moved


@pytest.mark.parametrize("form", ["joint", "advantage"])
def test_rl_plus_distillation_in_both_forms(tmp_path, teacher, form):
    cli(["--config-name", "grpo", *TINY, f"+teacher.path={teacher}", f"teacher.loss_form={form}",
         "teacher.distill_loss_weight=0.5", "trial_name=rd"], cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "grpo" / "rd")
    assert sorted(records) == [1, 2]
    for r in records.values():
        assert "actor/clip_frac" in r and "distill/reverse_kl" in r and "reward/gsm8k_reward_fn" in r


def _routed_data(tmp_path) -> str:
    rows = arith.generate("train", 48, seed=3)
    for r in rows:
        r["task_type"] = "add" if " + " in r["answer"] else "sub"
    path = tmp_path / "routed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_mopd_routes_rows_to_two_teachers_by_a_dataset_column(tmp_path, teacher):
    data = _routed_data(tmp_path)
    args = ["--config-name", "grpo", *TINY, f"train_dataset.path={data}", "allow_builtin_model_on_any_data=true",
            f"+teacher.teachers.add.path={teacher}", "+teacher.teachers.sub.path=builtin:tiny",
            "teacher.mopd.rl_coefficient=1.0", "teacher.mopd.distillation_coefficient=0.5", "trial_name=m"]
    cli(args, cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "grpo" / "m")
    assert sorted(records) == [1, 2]
    rows = sum(r.get("distill/teacher_rows/add", 0) + r.get("distill/teacher_rows/sub", 0) for r in records.values())
    assert rows == sum(r["rollout/rows"] for r in records.values())  # every row scored by its one teacher
    assert all("distill/is_clip_frac" in r and "distill/is_weight" in r for r in records.values())
    # A route value without a teacher stops the run before any weights load, naming it.
    bad = [a for a in args if not a.startswith(("+teacher.teachers", "trial_name"))]
    out = cli([*bad, "+teacher.teachers.other.path=builtin:tiny", "trial_name=bad"], cwd=tmp_path, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "task_type='add', which no teacher takes" in out.stderr and "task_type='sub'" in out.stderr


def test_resume_with_a_teacher_equals_the_uninterrupted_run_and_refuses_another_teacher(tmp_path, teacher):
    args = ["--config-name", "distill", "+scale=tiny", f"teacher.path={teacher}", "saver.freq_steps=2",
            "evaluator.freq_steps=2"]
    cli([*args, "total_train_steps=4", "trial_name=full"], cwd=tmp_path)
    cli([*args, "total_train_steps=2", "trial_name=cut"], cwd=tmp_path)
    refused = cli([*args, "total_train_steps=4", "trial_name=cut", "recover.mode=auto", "teacher.path=builtin:tiny"],
                  cwd=tmp_path, check=False)
    assert refused.returncode == 1 and "teacher.path" in refused.stderr
    out = cli([*args, "total_train_steps=4", "trial_name=cut", "recover.mode=auto"], cwd=tmp_path)
    assert "resuming from" in out.stdout
    full, resumed = (step_records(tmp_path / "outputs" / "distill" / "full"),
                     step_records(tmp_path / "outputs" / "distill" / "cut"))
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in range(1, 5):
        assert comparable(resumed[step]) == comparable(full[step]), step
    # The teacher's micro-batching only changes memory (and float rounding): a resume may change it.
    out = cli([*args, "total_train_steps=4", "trial_name=cut", "recover.mode=auto", "teacher.mb_spec.n_mbs=2"],
              cwd=tmp_path)
    assert "already complete" in out.stdout


def test_async_run_with_a_teacher_scores_what_it_trains(tmp_path, teacher):
    cli(["--config-name", "distill", *TINY, f"teacher.path={teacher}", "rollout.max_head_offpolicyness=2",
         "total_train_steps=4", "trial_name=a"], cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "distill" / "a")
    assert sorted(records) == [1, 2, 3, 4]
    assert all(r["actor/staleness/max"] <= 2 and r["distill/n_valid_tokens"] == r["actor/n_valid_tokens"]
               for r in records.values())


@pytest.mark.parametrize("rollout", [
    ["rollout.workflow=areal_trainer.rollout.agents.multi_turn.MultiTurnWorkflow", "actor.gae_timestep_unit=turn"],
    ["rollout.agent=tests.agents.simple.try_again", "rollout.agent_export=individual"],
], ids=["multi_turn_workflow", "agent"])
def test_multi_turn_rows_and_agents_with_a_teacher_score_only_trained_tokens(tmp_path, teacher, rollout):
    """The feedback between turns (untrained) is never scored: the teacher counts exactly the tokens the
    update trains (the unit test in tests/train/test_teacher.py checks the positions)."""
    cli(["--config-name", "grpo", *TINY, f"+teacher.path={teacher}", "teacher.loss_form=advantage",
         "teacher.distill_loss_weight=1", *rollout, "trial_name=mt"], cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "grpo" / "mt")
    assert sorted(records) == [1, 2]
    for r in records.values():
        assert r["distill/n_valid_tokens"] == r["actor/n_valid_tokens"] > 0 and "reward/task" in r
    if rollout[0].startswith("rollout.agent="):
        assert max(r["rollout/rows"] for r in records.values()) > 4  # some episodes made a second call
    else:
        assert max(r["rollout/num_turns"] for r in records.values()) > 1  # some rows hold feedback


def test_lora_student_learns_from_a_teacher_and_saves_only_its_adapter(tmp_path, teacher):
    """A LoRA student with RL plus the per-token advantage term: the adapter is what trains (and what the
    checkpoint holds); the teacher scores the rows the merged weights sampled."""
    cli(["--config-name", "grpo", *TINY, f"+teacher.path={teacher}", "teacher.loss_form=advantage",
         "teacher.distill_loss_weight=1", "actor.use_lora=true", "actor.lora_rank=8", "actor.optimizer.lr=1e-2",
         "rollout.dtype=float32", "trial_name=l"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "l"
    records = step_records(run)
    assert sorted(records) == [1, 2]
    assert all(r["distill/n_valid_tokens"] == r["actor/n_valid_tokens"] > 0 for r in records.values())
    assert records[2]["mismatch/abs_logp_diff/max"] < 1e-5  # the rollout copy got base + adapter after step 1
    assert records[2]["distill/reverse_kl"] != records[1]["distill/reverse_kl"]
    saved = run / "checkpoints" / "step_2" / "actor"
    assert (saved / "adapter_model.safetensors").is_file() and not (saved / "model.safetensors").exists()


def test_fsdp_lora_student_with_a_teacher_resumes_exactly(tmp_path, teacher):
    """Two FSDP2 processes, a LoRA student, pure distillation from a replicated teacher: checkpoints hold the
    adapter, and resuming from step 1 repeats step 2 exactly (the teacher is loaded again from its path)."""
    from .test_fsdp import LAUNCH, _run

    args = [*LAUNCH, "-m", "areal_trainer", "--config-name", "distill", "+scale=tiny", "train_dataset.batch_size=4",
            "saver.freq_steps=1", "valid_dataset=null", "evaluator.eval_before_train=false", "actor.use_lora=true",
            "actor.lora_rank=8", "actor.optimizer.lr=1e-2", "rollout.dtype=float32", f"teacher.path={teacher}",
            "actor.mb_spec.max_tokens_per_mb=64", "trial_name=fl", "parallel.fsdp=true"]
    _run(args, tmp_path)
    run = tmp_path / "outputs" / "distill" / "fl"
    full = {k: comparable(v) for k, v in step_records(run).items()}
    assert sorted(full) == [1, 2]
    for r in full.values():  # 4 prompts x 2 samples over 2 processes, every trained token scored
        assert r["rollout/rows"] == 8 and r["distill/n_valid_tokens"] == r["actor/n_valid_tokens"] > 0
    assert full[2]["distill/reverse_kl"] != full[1]["distill/reverse_kl"]
    assert (run / "checkpoints" / "step_1" / "actor" / "adapter_model.safetensors").is_file()
    shutil.rmtree(run / "checkpoints" / "step_2")
    _run([*args, "recover.mode=auto"], tmp_path)
    assert (run / "checkpoints" / "step_2" / "COMPLETE").exists()  # step 2 ran again
    assert {k: comparable(v) for k, v in step_records(run).items()} == full


def test_bad_teachers_are_reported_before_anything_loads(tmp_path):
    out = cli(["--config-name", "distill", "+scale=tiny", "teacher.path=/no/such/teacher",
               "teacher.distill_loss_weight=-1"], cwd=tmp_path, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr  # configuration errors
    assert "teacher.path: '/no/such/teacher' does not exist" in out.stderr
    assert "teacher.distill_loss_weight: got -1.0" in out.stderr
    assert not (tmp_path / "outputs").exists()
    other = build_other_vocabulary(tmp_path)
    out = cli(["--config-name", "distill", "+scale=tiny", f"teacher.path={other}"], cwd=tmp_path, check=False)
    assert (out.returncode == 1 and "the teacher's vocabulary" in out.stderr
            and "actor.path='builtin:tiny'" in out.stderr)
    assert "sft" not in out.stdout.lower()  # stopped before the warm start


def build_other_vocabulary(tmp_path) -> str:
    from areal_trainer.model.builtin import build_model, build_tokenizer

    tok = build_tokenizer()
    tok.add_tokens(["zyzzyva"])
    path = tmp_path / "other_teacher"
    build_model("builtin:tiny", tok, 0).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
