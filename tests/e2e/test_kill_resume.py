"""A run SIGKILLed at ten random moments (one of them while the first resume loads its checkpoint),
resumed each time with ``recover.mode=auto``, ends with exactly the metrics of the run that was never
interrupted: every step once, every value equal.

The moments are chosen by what the run reports, so that there are ten kills on any machine, fast or
slow: a kill lands at a random point of a window between two events on disk, at the latest when the
window closes, or at an exact point of start-up or saving (``AREAL_TRAINER_FAULT``). The windows are
the start-up (from the start of the process to its first checkpoint: loading, restoring, rewriting the
history, the first step) and one step (from one checkpoint to the next: pruning, rollout, update,
evaluation, the record, saving). The random point is a fraction of the window's length in the
uninterrupted run; where a run is slower, its window closes first. A killed run gets at most three
checkpoints further, so ten of them cannot finish the 32 steps."""

import json
import os
import random
import signal
import subprocess
import time

from .helpers import HANG, checkpoint_steps, popen, wait_until

STEPS = 32
ARGS = ["--config-name", "grpo", "+scale=tiny", "saver.freq_steps=1", f"total_train_steps={STEPS}",
        "experiment_name=x", "trial_name=t", "recover.mode=auto"]
"""Evaluated before training and after every step (``+scale=tiny``), saved after every step."""
VOLATILE = ("time/", "perf/", "sft/cached", "lr_time")
"""Keys that measure wall time (or whether the warm start came from the cache), not the training."""
EXACT = ("history.before_replace", "checkpoint.before_marker", "checkpoint.before_rename", "prune.after_marker")
"""The fault points of a resumed run's start-up and of saving (areal_trainer/faults.py)."""


def _history(root) -> list[dict]:
    with open(os.path.join(root, "outputs", "x", "t", "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)} for line in f]


def _start(root, env=None) -> subprocess.Popen:
    return popen(ARGS, root, env, stdout=subprocess.DEVNULL)


def _newest(root) -> int:
    """The step of the newest complete checkpoint, 0 before the first."""
    run = root / "outputs" / "x" / "t"
    return max((s for s in checkpoint_steps(run) if (run / "checkpoints" / f"step_{s}" / "COMPLETE").exists()),
               default=0) if (run / "checkpoints").exists() else 0


def _lengths(root) -> tuple[float, float]:
    """The uninterrupted run, and its start-up window's length and one step window's, in seconds."""
    t0, proc = time.monotonic(), _start(root)
    wait_until(lambda: _newest(root) >= 1, proc, "the first checkpoint")
    startup = time.monotonic() - t0
    assert proc.wait(timeout=HANG) == 0, proc.stderr.read()[-3000:]
    return startup, (time.monotonic() - t0 - startup) / (STEPS - 1)


def _kill_in_window(root, proc: subprocess.Popen, opens: int, closes: int, delay: float) -> None:
    """SIGKILL ``proc`` ``delay`` s after checkpoint ``opens`` is complete (0: after its start), or as soon
    as checkpoint ``closes`` is, whichever comes first."""
    wait_until(lambda: _newest(root) >= opens, proc, f"checkpoint {opens}")
    opened = time.monotonic()
    wait_until(lambda: _newest(root) >= closes or time.monotonic() - opened >= delay, proc, f"checkpoint {closes}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG)


def _killed_by_fault(root, proc: subprocess.Popen, fault: str, newest: int) -> None:
    """Wait until ``proc`` kills itself at ``fault``: each point is reached before a resumed run has
    completed four checkpoints (a prune, the last of them, only once two checkpoints are older)."""
    wait_until(lambda: proc.poll() is not None or _newest(root) >= newest + 4, proc, f"{fault} or four checkpoints")
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=HANG)
        raise AssertionError(f"AREAL_TRAINER_FAULT={fault} was not reached in four steps")
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]


def test_ten_random_kills_end_like_the_uninterrupted_run(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir()
    killed.mkdir()
    startup, step = _lengths(reference)
    rng = random.Random(20261201)
    # The first kill comes after the first checkpoint (so that the next start resumes), the second while the
    # first resume has loaded its checkpoint, before its first step; then windows and exact points, mixed.
    kinds = ["start-up"] * 3 + ["step"] * 3 + ["exact"] * 2
    rng.shuffle(kinds)
    for kill, kind in enumerate(["step", "restored", *kinds]):
        newest = _newest(killed)
        if kind == "restored":
            proc = _start(killed, {"AREAL_TRAINER_FAULT": "resume.after_restore"})
            assert proc.wait(timeout=HANG) == -signal.SIGKILL, proc.stderr.read()[-2000:]
        elif kind == "exact":
            fault = f"{rng.choice(EXACT)}@{rng.randint(1, 2)}"
            _killed_by_fault(killed, _start(killed, {"AREAL_TRAINER_FAULT": fault}), fault, newest)
        elif kind == "start-up":  # up to its first checkpoint
            _kill_in_window(killed, _start(killed), 0, newest + 1, rng.uniform(0, startup))
        else:  # the run's first or second step after its first checkpoint
            opens = newest + rng.randint(1, 2)
            _kill_in_window(killed, _start(killed), opens, opens + 1, rng.uniform(0, step))
        assert _newest(killed) < STEPS, f"kill {kill + 1} ({kind}) came after the run had finished"
    proc = _start(killed)
    assert proc.wait(timeout=HANG) == 0, proc.stderr.read()[-3000:]
    got, want = _history(killed), _history(reference)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert got == want
