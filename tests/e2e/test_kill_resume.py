"""A run SIGKILLed at ten random moments (one of them while the first resume loads its checkpoint),
resumed each time with ``recover.mode=auto``, ends with exactly the metrics of the run that was never
interrupted: every step once, every value equal."""

import json
import os
import random
import signal
import subprocess
import sys
import time

from .helpers import cli_env

ARGS = ["--config-name", "grpo", "+scale=tiny", "valid_dataset=null", "saver.freq_steps=1", "total_train_steps=32",
        "experiment_name=x", "trial_name=t", "recover.mode=auto"]
VOLATILE = ("time/", "perf/", "sft/cached", "lr_time")
"""Keys that measure wall time (or whether the warm start came from the cache), not the training."""


def _history(root) -> list[dict]:
    with open(os.path.join(root, "outputs", "x", "t", "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)} for line in f]


def _start(root, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "areal_trainer", *ARGS], cwd=root, env=cli_env(env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill(proc: subprocess.Popen) -> bool:
    """SIGKILL ``proc``; False when it had already ended by itself."""
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return True


def test_ten_random_kills_end_like_the_uninterrupted_run(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir()
    killed.mkdir()
    t0, first = time.time(), reference / "outputs" / "x" / "t" / "checkpoints" / "step_1" / "COMPLETE"
    proc = _start(reference)
    while not first.exists() and proc.poll() is None:
        time.sleep(0.02)
    startup = time.time() - t0  # start-up and the first step
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
    steps = time.time() - t0 - startup
    # Kills land anywhere from the start-up to about a seventh of the steps: ten runs cannot finish them all.
    latest = startup + steps / 7
    rng = random.Random(20261201)
    ckpts = killed / "outputs" / "x" / "t" / "checkpoints"
    kills = attempts = 0
    while kills < 10:
        attempts += 1
        assert attempts < 40, "the runs kept ending before they could be killed"
        if kills == 1:  # the first resume: killed once it has loaded its checkpoint, before its first step
            proc = _start(killed, {"AREAL_TRAINER_FAULT": "resume.after_restore"})
            proc.wait(timeout=300)
            assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
            kills += 1
            continue
        proc = _start(killed)
        if kills == 0:  # the first kill comes after the first checkpoint, so that the next start resumes
            while not (ckpts / "step_1" / "COMPLETE").exists():
                assert proc.poll() is None, proc.stderr.read()[-2000:]
                time.sleep(0.02)
        time.sleep(rng.uniform(0.1, latest))
        kills += _kill(proc)
        assert not (ckpts / "step_32" / "COMPLETE").exists(), "finished before ten kills"
    proc = _start(killed)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
    assert kills == 10
    got, want = _history(killed), _history(reference)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert got == want
