"""What real runs meet, through the real command line: changed settings on resume, damaged checkpoints,
two runs in one directory, a kill while the history is rewritten or a checkpoint is saved or pruned, a
full disk, bad data files, a damaged warm-start cache, a resume past the end, and a crash's traceback
in the run log. Kills at exact moments use the fault-injection points of ``areal_trainer/faults.py``."""

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest

from .helpers import HANG, cli, cli_env, popen, wait_until

TINY = ["--config-name", "grpo", "+scale=tiny", "valid_dataset=null", "saver.freq_steps=1", "saver.keep_last=5",
        "experiment_name=x",
        "trial_name=t"]
RESUME = [*TINY, "recover.mode=auto"]


def _run_dir(root) -> str:
    return os.path.join(root, "outputs", "x", "t")


def _records(root) -> list[dict]:
    with open(os.path.join(_run_dir(root), "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _steps(root) -> list[int]:
    return [r["step"] for r in _records(root) if "time/step" in r]


def _snapshot(root) -> dict[str, str]:
    """Every file of the run directory (but the lock file, which holds the last starter's PID) by checksum."""
    out, run = {}, _run_dir(root)
    for d, _, names in os.walk(run):
        for n in names:
            path = os.path.join(d, n)
            if n != ".lock":
                with open(path, "rb") as f:
                    out[os.path.relpath(path, run)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    """A finished 3-step run with a checkpoint after every step; tests work on copies of it."""
    root = tmp_path_factory.mktemp("base")
    cli([*TINY, "total_train_steps=3"], cwd=root)
    return root


@pytest.fixture
def run(three_steps, tmp_path):
    shutil.copytree(os.path.join(three_steps, "outputs"), tmp_path / "outputs")
    return tmp_path


# -- 1. changed settings on resume ----------------------------------------------------------------------
def test_a_resume_applies_a_new_learning_rate_and_records_it(run):
    proc = cli([*RESUME, "total_train_steps=5", "actor.optimizer.lr=5e-5"], cwd=run)
    assert "actor.optimizer.lr: 0.0001 -> 5e-05" in proc.stdout
    lrs = {r["step"]: r["lr"] for r in _records(run) if "lr" in r}
    assert lrs == {1: 1e-4, 2: 1e-4, 3: 1e-4, 4: 5e-5, 5: 5e-5}
    with open(os.path.join(_run_dir(run), ".hydra", "resumes.yaml")) as f:
        text = f.read()
    assert "actor.optimizer.lr" in text and "checkpoints/step_3" in text
    with open(os.path.join(_run_dir(run), ".hydra", "overrides.yaml")) as f:
        assert "actor.optimizer.lr=5e-5" not in f.read()  # the first start's record is kept


@pytest.mark.parametrize("change, key", [
    ("seed=2", "seed: 1 -> 2"),
    ("algo=rloo", "algorithm: 'grpo' -> 'rloo'"),
    ("train_dataset.batch_size=4", "train_dataset.batch_size: 2 -> 4"),
    ("gconfig.n_samples=4", "gconfig.n_samples: 2 -> 4"),
    ("actor.path=builtin:small", "actor.path: 'builtin:tiny' -> 'builtin:small'"),
    ("algo=ppo", "algorithm: 'grpo' -> 'ppo'"),
])
def test_a_resume_that_would_train_something_else_is_refused_and_changes_nothing(run, change, key):
    before = _snapshot(run)
    proc = cli([*RESUME, "total_train_steps=5", change], cwd=run, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "was trained with other settings, which a resume cannot change" in proc.stderr
    assert f"  - {key}" in proc.stderr and "Nothing was changed on disk" in proc.stderr
    assert _snapshot(run) == before


def test_following_the_non_finite_advice_resumes_from_before_the_streak_with_the_lower_lr(run):
    surrogate = ["actor.loss.surrogate.implementation=tests.plugins.nan_when_asked", "actor.use_decoupled_loss=false",
                 "actor.rejection_sampling=null", "actor.max_consecutive_nonfinite_steps=2"]
    fresh = run / "fresh"
    fresh.mkdir()
    cli([*TINY, "total_train_steps=2", *surrogate], cwd=fresh)
    proc = cli([*RESUME, "total_train_steps=6", *surrogate], cwd=fresh, check=False,
               env={"AREAL_TEST_NAN": "1"})
    assert proc.returncode == 1
    line = _one_error_line(proc)
    assert "2 consecutive optimizer steps had a non-finite loss" in line
    assert "checkpoints/step_2, was written before these steps" in line and "actor.optimizer.lr=<lower>" in line
    assert sorted(os.listdir(os.path.join(_run_dir(fresh), "checkpoints"))) == ["step_1", "step_2"]
    cli([*RESUME, "total_train_steps=4", *surrogate, "actor.optimizer.lr=5e-5"], cwd=fresh)
    last = {r["step"]: r for r in _records(fresh) if "lr" in r}
    assert sorted(last) == [1, 2, 3, 4] and last[3]["lr"] == last[4]["lr"] == 5e-5
    assert last[3]["update/skipped_steps"] == 0


# -- 2. damaged checkpoints ----------------------------------------------------------------------------
def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(64)
        f.seek(-len(data), os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("damage, file, what", [
    (_truncate, "trainer_state.pt", "trainer_state.pt has"),
    (_truncate, "actor/model.safetensors", "actor/model.safetensors has"),
    (os.remove, "actor/model.safetensors", "actor/model.safetensors is missing"),
    (_flip, "actor/model.safetensors", "actor/model.safetensors has the right size but other contents"),
])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(run, damage, file, what):
    damage(os.path.join(_run_dir(run), "checkpoints", "step_3", file))
    proc = cli([*RESUME, "total_train_steps=4"], cwd=run)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:") and "damaged" in line]
    assert len(warnings) == 1 and "checkpoints/step_3 is damaged: " + what in warnings[0], proc.stderr[-2000:]
    assert "resuming from" in proc.stdout and "checkpoints/step_2 (step 2 of 4)" in proc.stdout
    assert _steps(run) == [1, 2, 3, 4]


def test_when_every_checkpoint_is_damaged_the_error_names_them_all(run):
    for step in (1, 2, 3):
        _truncate(os.path.join(_run_dir(run), "checkpoints", f"step_{step}", "trainer_state.pt"))
    proc = cli([*RESUME, "total_train_steps=4"], cwd=run, check=False)
    line = _one_error_line(proc)
    assert proc.returncode == 1 and all(f"checkpoints/step_{s} is damaged" in line for s in (1, 2, 3))


def test_a_stray_directory_beside_the_checkpoints_is_left_alone(run):
    ckpts = os.path.join(_run_dir(run), "checkpoints")
    shutil.copytree(os.path.join(ckpts, "step_3"), os.path.join(ckpts, "step_final"))
    proc = cli([*RESUME, "total_train_steps=4"], cwd=run)
    assert "checkpoints/step_3 (step 3 of 4)" in proc.stdout
    assert os.path.isdir(os.path.join(ckpts, "step_final"))


# -- 3. two runs in one directory ------------------------------------------------------------------------
def test_a_second_run_in_the_same_directory_stops_at_once_naming_the_first(tmp_path):
    # The first run's reward waits for the file ``release``: it holds the directory until the second is refused.
    release = tmp_path / "release"
    first = popen([*TINY, "total_train_steps=3", "reward.fn=tests.plugins.held_reward", "reward.workers=0"],
                  tmp_path, {"AREAL_TEST_RELEASE": str(release)})
    try:
        lock = tmp_path / "outputs" / "x" / "t" / ".lock"
        wait_until(lambda: lock.exists() and lock.read_text().strip(), first, "the first run's lock")
        before = _snapshot(tmp_path)
        proc = cli([*TINY, "total_train_steps=3"], cwd=tmp_path, check=False)
        line = _one_error_line(proc)
        assert proc.returncode == 1 and f"is in use by another run (PID {first.pid})" in line
        assert set(before) <= set(_snapshot(tmp_path))  # nothing of the first run was touched or removed
    finally:
        release.touch()
        out, err = first.communicate(timeout=HANG)
    assert first.returncode == 0, err[-3000:]
    assert _steps(tmp_path) == [1, 2, 3]  # one record per step


# -- 4. the history is never rewritten in place ----------------------------------------------------------
def test_a_kill_while_the_history_is_rewritten_leaves_it_whole(run):
    history = _records(run)
    proc = cli([*RESUME, "total_train_steps=5"], cwd=run, check=False,
               env={"AREAL_TRAINER_FAULT": "history.before_replace"})
    assert proc.returncode == -9
    assert _records(run) == history
    cli([*RESUME, "total_train_steps=5"], cwd=run)
    assert _steps(run) == [1, 2, 3, 4, 5]
    assert not [n for n in os.listdir(_run_dir(run)) if ".tmp-" in n]


# -- 5. leftovers of killed saves and prunes -------------------------------------------------------------
def test_a_kill_during_a_save_leaves_a_temporary_directory_that_the_next_start_removes(run):
    proc = cli([*RESUME, "total_train_steps=5"], cwd=run, check=False,
               env={"AREAL_TRAINER_FAULT": "checkpoint.before_marker"})
    assert proc.returncode == -9
    ckpts = os.path.join(_run_dir(run), "checkpoints")
    assert [n for n in os.listdir(ckpts) if n.startswith(".tmp-step_4")]
    cli([*RESUME, "total_train_steps=5"], cwd=run)
    assert sorted(os.listdir(ckpts)) == ["step_1", "step_2", "step_3", "step_4", "step_5"]


def test_a_kill_during_a_prune_leaves_no_checkpoint_that_looks_complete(run):
    ckpts = os.path.join(_run_dir(run), "checkpoints")
    proc = cli([*RESUME, "total_train_steps=5", "saver.keep_last=2"], cwd=run, check=False,
               env={"AREAL_TRAINER_FAULT": "prune.after_marker"})
    assert proc.returncode == -9
    assert not os.path.exists(os.path.join(ckpts, "step_1", "COMPLETE"))  # removed first: never mistaken
    cli([*RESUME, "total_train_steps=5", "saver.keep_last=2"], cwd=run)
    assert sorted(os.listdir(ckpts)) == ["step_4", "step_5"]
    assert _steps(run) == [1, 2, 3, 4, 5]


# -- 6. a full disk --------------------------------------------------------------------------------------
def test_a_save_that_cannot_write_is_one_line_and_keeps_the_earlier_checkpoints(run):
    def small_files():  # every file write past 2 MB fails (EFBIG), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))

    proc = subprocess.run([sys.executable, "-m", "areal_trainer", *RESUME, "total_train_steps=5"], cwd=run,
                          env=cli_env(), capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    assert proc.returncode == 1
    line = _one_error_line(proc)
    assert "cannot write checkpoint step_4 into" in line and "Free space there:" in line
    assert "the earlier checkpoints are kept (newest:" in line and "checkpoints/step_3)" in line
    ckpts = os.path.join(_run_dir(run), "checkpoints")
    assert sorted(os.listdir(ckpts)) == ["step_1", "step_2", "step_3"]  # no partial directory left
    cli([*RESUME, "total_train_steps=5"], cwd=run)
    assert _steps(run) == [1, 2, 3, 4, 5]


# -- 7. bad data files -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, content, shown", [
    ("empty.jsonl", b"", "holds no rows (an empty file?)"),
    ("latin1.jsonl", '{"question": "caf\xe9 q", "answer": "#### 1"}\n'.encode("latin-1"),
     "is not UTF-8 text: byte 0xe9 at line 1, column 18"),
    ("bad.jsonl", b'{"question": "a", "answer": "#### 1"}\n{"question": "b", "answer": \n',
     "line 2 of"),
    ("fake.parquet", b"question,answer\na,#### 1\n", "cannot be read as Parquet"),
])
def test_a_bad_data_file_is_one_error_line_naming_it(tmp_path, name, content, shown):
    path = tmp_path / name
    path.write_bytes(content)
    proc = cli([*TINY, f"train_dataset.path={path}", "allow_builtin_model_on_any_data=true"], cwd=tmp_path,
               check=False)
    line = _one_error_line(proc)
    assert proc.returncode == 1 and shown in line and name in line
    assert not (tmp_path / "outputs" / "x" / "t").exists()  # failed before training: no run directory


# -- 10. a damaged warm-start cache entry ----------------------------------------------------------------
def test_a_damaged_warm_start_cache_entry_is_recomputed_with_a_warning(tmp_path):
    env = {"AREAL_TRAINER_CACHE": str(tmp_path / "cache")}
    cli([*TINY, "total_train_steps=1", "trial_name=a"], cwd=tmp_path, env=env)
    (entry,) = (tmp_path / "cache" / "warmstart").iterdir()
    _truncate(entry / "model.pt")
    proc = cli([*TINY, "total_train_steps=1", "trial_name=b"], cwd=tmp_path, env=env)
    assert f"warning: the cached warm start {entry} is damaged" in proc.stdout
    proc = cli([*TINY, "total_train_steps=1", "trial_name=c"], cwd=tmp_path, env=env)
    assert "warning: the cached warm start" not in proc.stdout and "reused" in proc.stdout  # stored again, whole


# -- 11. resuming past the end; a crash in the run log ---------------------------------------------------
def test_a_resume_past_the_end_says_the_run_is_complete_and_changes_nothing(run):
    before = _snapshot(run)
    proc = cli([*RESUME, "total_train_steps=2"], cwd=run)
    assert "The run is already complete" in proc.stdout and "step 3" in proc.stdout
    assert _snapshot(run) == before


def test_a_crash_that_ends_in_a_traceback_reaches_the_run_log(tmp_path):
    proc = cli([*TINY, "total_train_steps=2", "rollout.dynamic_filter=tests.plugins.crashing_filter"], cwd=tmp_path,
               check=False)
    assert proc.returncode == 1 and "ZeroDivisionError" in proc.stderr
    with open(os.path.join(_run_dir(tmp_path), "__main__.log")) as f:
        log = f.read()
    assert "Traceback (most recent call last)" in log and "ZeroDivisionError" in log
