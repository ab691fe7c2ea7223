"""A run forked from the tests' fork server (tests/e2e/forkserver.py) is the command line: the same records,
output and exit status as ``python -m areal_trainer`` in a process of its own, a plugin module found in
the working directory, the run's own environment; a run past its timeout is killed; an environment
that a library reads at import time starts a process instead. A run left going (``start``) answers
signals and ``wait`` as a process does, and one dropped while going is killed."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys

import pytest

from . import forkserver
from .helpers import cli_env, comparable, step_records, wait_until

pytestmark = pytest.mark.skipif(os.environ.get("AREAL_TEST_FORK") == "0", reason="AREAL_TEST_FORK=0: no forked runs")
ARGS = ["--config-name", "grpo", "+scale=tiny", "total_train_steps=2", "saver.freq_steps=null",
        "stats_logger.plot=false"]
LONG = ["total_train_steps=100000", "total_train_epochs=10000"]
"""Steps and epochs that no test waits for: the run goes on until it is stopped."""


def _both(args: list[str], tmp_path):
    """The run forked and in a process of its own, in ``tmp_path``'s ``forked`` and ``process``."""
    full = cli_env()
    for where in ("forked", "process"):
        (tmp_path / where).mkdir(exist_ok=True)
    forked = forkserver.run(args, tmp_path / "forked", full, timeout=300, base=full)
    assert forked is not None, "the run was not forked"
    alone = subprocess.run([sys.executable, "-m", "areal_trainer", *args], cwd=tmp_path / "process", env=full,
                           capture_output=True, text=True, timeout=300)
    return forked, alone


def test_a_forked_run_trains_and_reports_as_a_process_does(tmp_path):
    forked, alone = _both([*ARGS, "trial_name=t"], tmp_path)
    assert forked.returncode == alone.returncode == 0, forked.stderr[-3000:]
    runs = [step_records(tmp_path / d / "outputs" / "grpo" / "t") for d in ("forked", "process")]
    assert sorted(runs[0]) == [1, 2]
    assert [comparable(r) for r in runs[0].values()] == [comparable(r) for r in runs[1].values()]
    result = [line for line in forked.stdout.splitlines() if line.startswith("held-out accuracy")]
    assert result and result == [line for line in alone.stdout.splitlines() if line.startswith("held-out accuracy")]


def test_a_config_error_is_the_same_line_and_exit_status(tmp_path):
    forked, alone = _both([*ARGS, "actor.ppo_n_minibatches=0"], tmp_path)
    assert forked.returncode == alone.returncode == 2
    assert forked.stderr == alone.stderr and forked.stderr.startswith("Error:")


def test_a_plugin_module_in_the_working_directory_is_imported(tmp_path):
    """``python -m`` puts the working directory first on ``sys.path``; so does the forked run. The plugin
    returns the wrong type, so both runs stop with the one error line naming it."""
    for where in ("forked", "process"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "local_workflow.py").write_text(
            "from tests.plugins import TextWorkflow\n\n\nclass LocalWorkflow(TextWorkflow):\n    pass\n")
    forked, alone = _both([*ARGS, "valid_dataset=null", "sft_warmup.steps=0",
                           "rollout.workflow=local_workflow.LocalWorkflow"], tmp_path)
    assert forked.returncode == alone.returncode == 1
    error = [line for line in forked.stderr.splitlines() if line.startswith("Error:")]
    assert error == [line for line in alone.stderr.splitlines() if line.startswith("Error:")]
    assert "rollout.workflow local_workflow.LocalWorkflow" in error[0]


def test_the_run_has_its_own_environment(tmp_path):
    """A run-time key (``AREAL_*``) of the run, not of the server: the fault named in it kills the run as
    its first checkpoint is about to be marked complete."""
    proc = forkserver.run([*ARGS, "saver.freq_steps=1", "trial_name=t"], tmp_path,
                          cli_env({"AREAL_TRAINER_FAULT": "checkpoint.before_marker"}), timeout=300, base=cli_env())
    assert proc is not None and proc.returncode == -9
    names = os.listdir(tmp_path / "outputs" / "grpo" / "t" / "checkpoints")
    assert [n for n in names if n.startswith(".tmp-step_1")], names


def test_a_run_past_its_timeout_is_killed(tmp_path):
    """The timeout (4 s) is far shorter than the run (100000 steps), whatever the machine's speed."""
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([*ARGS, *LONG], tmp_path, cli_env(), timeout=4, base=cli_env())
    proc = forkserver.run([*ARGS, "trial_name=after"], tmp_path, cli_env(), timeout=300, base=cli_env())
    assert proc is not None and proc.returncode == 0  # the server serves the next run


@pytest.mark.parametrize("key", ["OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "PYTHONHASHSEED"])
def test_a_key_read_at_import_time_starts_a_process(tmp_path, key):
    env = cli_env({key: "7" if os.environ.get(key) != "7" else "3"})
    assert forkserver.run(ARGS, tmp_path, env, timeout=300, base=cli_env()) is None


def _recorded(proc, cwd):
    """``proc`` (a run of trial ``t`` in ``cwd``) once it has written its first record."""
    wait_until(lambda: (cwd / "outputs" / "grpo" / "t" / "metrics.jsonl").exists(), proc, "a record")
    return proc


def _started(tmp_path, where: str):
    """A run of 100000 steps, forked and left running, once it has recorded its first step."""
    (tmp_path / where).mkdir()
    proc = forkserver.start([*ARGS, *LONG, "trial_name=t"], tmp_path / where, cli_env(), base=cli_env())
    assert proc is not None, "the run was not forked"
    return _recorded(proc, tmp_path / where)


def test_a_started_run_stops_on_a_signal_as_a_process_does(tmp_path):
    """SIGTERM stops the run with the trainer's line and status, as it stops ``python -m areal_trainer``
    started by ``subprocess.Popen``; ``poll``, ``wait`` and the output behave as a process's."""
    proc = _started(tmp_path, "forked")
    (tmp_path / "process").mkdir()
    alone = _recorded(subprocess.Popen([sys.executable, "-m", "areal_trainer", *ARGS, *LONG, "trial_name=t"],
                                       cwd=tmp_path / "process", env=cli_env(), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True), tmp_path / "process")
    assert proc.poll() is None and alone.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)
    for p in (proc, alone):
        p.send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=300) for p in (proc, alone)]
    assert proc.returncode == alone.returncode == 143
    stopped = [[line for line in err.splitlines() if "SIGTERM" in line] for _, err in outputs]
    assert stopped[0] and stopped[0] == stopped[1]
    assert proc.stderr.read() == "" and proc.poll() == 143  # read to its end, as a pipe is


def test_a_run_dropped_while_going_is_killed_and_the_next_is_forked(tmp_path):
    """A test that fails while its run goes drops it: the run is killed and the next run is forked."""
    pid = _started(tmp_path, "dropped").pid
    gc.collect()
    proc = forkserver.run([*ARGS, "trial_name=next"], tmp_path / "dropped", cli_env(), timeout=300, base=cli_env())
    assert proc is not None and proc.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
