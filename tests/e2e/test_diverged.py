"""A run that diverges (``actor.optimizer.lr=1e6``) and its resume with a sane learning rate, through the
real CLI: each stop names the checkpoint that diverged and says there is no healthy one to go back to."""

import os
import subprocess
import sys

from .helpers import cli

RUN = ["--config-name", "grpo", "+scale=tiny", "total_train_steps=8", "trial_name=d", "saver.freq_steps=1",
       "saver.keep_last=10", "evaluator.freq_steps=null", "evaluator.eval_before_train=false", "valid_dataset=null",
       "actor.max_consecutive_nonfinite_steps=2", "stats_logger.progress_bar=false",
       "reward.fn=tests.plugins.odd_length"]


def test_a_diverged_checkpoint_is_named_on_the_stop_and_on_its_resume(tmp_path):
    first = cli([*RUN, "actor.optimizer.lr=1e6"], cwd=tmp_path, check=False)
    assert first.returncode == 1 and "Traceback" not in first.stderr
    step_1 = tmp_path / "outputs" / "grpo" / "d" / "checkpoints" / "step_1"
    assert (f"The newest checkpoint, {step_1}, has diverged too: its actor weight norm, " in first.stderr
            and "x that of the run's start" in first.stderr), first.stderr[-2000:]
    again = cli([*RUN, "actor.optimizer.lr=1e-3", "recover.mode=auto"], cwd=tmp_path, check=False)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert f"warning: {step_1} may have diverged: its actor weight norm" in again.stderr
    assert (f"Every step since resuming from {step_1} (actor weight norm " in again.stderr
            and "that checkpoint's weights have likely diverged, whatever the learning rate now. No earlier "
            "checkpoint is healthy: start a new run (another trial_name) with a lower actor.optimizer.lr."
            in again.stderr), again.stderr[-2000:]


FLIP = """
import glob, sys
from safetensors.torch import load_file, save_file
f = glob.glob(sys.argv[1] + "/actor/*.safetensors")[0]
state = load_file(f)
next(iter(state.values()))[0] = float("nan")
save_file(state, f, metadata={"format": "pt"})
"""


def test_a_checkpoint_without_a_manifest_is_resumed_with_a_warning_and_its_weights_checked(tmp_path):
    base = [*RUN[:3], "trial_name=m", *RUN[5:-1]]  # no total_train_steps, the default reward
    cli([*base, "total_train_steps=2"], cwd=tmp_path)
    step_2 = tmp_path / "outputs" / "grpo" / "m" / "checkpoints" / "step_2"
    (step_2 / "MANIFEST.json").unlink()
    subprocess.run([sys.executable, "-c", FLIP, str(step_2)], check=True)
    proc = cli([*base, "total_train_steps=4", "recover.mode=auto"], cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"warning: {step_2} has no MANIFEST.json (written by an older version, or copied without it)" in proc.stderr
    assert (f"Error: {step_2} has no MANIFEST.json, and its actor weights loaded with NaN or infinite values: its "
            "files are damaged (or it diverged)." in proc.stderr), proc.stderr[-2000:]


def _flip_bytes(path) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(64)
        f.seek(-len(data), os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in data))


def test_a_damaged_checkpoint_as_teacher_or_actor_is_named_before_training(tmp_path):
    base = [*RUN[:3], "trial_name=src", *RUN[5:-1]]
    cli([*base, "total_train_steps=1"], cwd=tmp_path)
    actor = tmp_path / "outputs" / "grpo" / "src" / "checkpoints" / "step_1" / "actor"
    _flip_bytes(next(actor.glob("*.safetensors")))
    run = [*RUN[:3], "total_train_steps=1", *RUN[5:-1]]
    as_teacher = cli([*run, "trial_name=t", f"+teacher.path={actor}"], cwd=tmp_path, check=False)
    assert as_teacher.returncode == 1 and "Traceback" not in as_teacher.stderr
    assert (f"teacher 'teacher' (teacher.path='{actor}') is a damaged checkpoint: actor/model.safetensors has the "
            "right size but other contents than were written (checksum mismatch)." in as_teacher.stderr), \
        as_teacher.stderr[-2000:]
    as_actor = cli([*run, "trial_name=a", f"actor.path={actor}"], cwd=tmp_path, check=False)
    assert as_actor.returncode == 1 and "Traceback" not in as_actor.stderr
    damaged = f"actor.path='{actor}' is a damaged checkpoint: actor/model.safetensors has the right size"
    assert damaged in as_actor.stderr, as_actor.stderr[-2000:]
    (actor.parent / "MANIFEST.json").unlink()  # unchecked now: the weights themselves tell
    subprocess.run([sys.executable, "-c", FLIP, str(actor.parent)], check=True)
    nan = cli([*run, "trial_name=n", f"+teacher.path={actor}"], cwd=tmp_path, check=False)
    assert nan.returncode == 1 and "Traceback" not in nan.stderr
    assert f"(teacher.path='{actor}') has NaN or infinite weights: the checkpoint is damaged" in nan.stderr, \
        nan.stderr[-2000:]
