"""One run per directory: a second holder is refused naming the first's PID, the lock dies with its
process (however it ends), and the processes of one job share it."""

import os
import signal
import subprocess
import sys

import pytest

from areal_trainer.tracking.rundir import LOCK_HELD_ENV, RunDirInUse, RunLock

HOLD = ("import sys, time; from areal_trainer.tracking.rundir import RunLock; RunLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(600)")


@pytest.fixture
def holder(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "RANK": "0", LOCK_HELD_ENV: ""})
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_start_is_refused_naming_the_holder(tmp_path, holder, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RunDirInUse, match=rf"is in use by another run \(PID {holder.pid}\)"):
        RunLock(str(tmp_path)).acquire()


def test_the_lock_goes_with_its_process(tmp_path, holder, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    holder.send_signal(signal.SIGKILL)
    holder.wait()  # reaped: the kernel has closed its files, and so released its lock
    lock = RunLock(str(tmp_path)).acquire()
    try:
        assert lock.owned and (tmp_path / ".lock").read_text().strip() == str(os.getpid())
    finally:
        lock.release()
    assert os.environ.get(LOCK_HELD_ENV) is None


def test_ranks_and_started_processes_share_the_lock(tmp_path, holder, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert not RunLock(str(tmp_path)).acquire().owned
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(LOCK_HELD_ENV, str(tmp_path))
    assert not RunLock(str(tmp_path)).acquire().owned
