"""WorkerPool: whatever a reward function does (hang, raise, exit, segfault, be killed), the caller gets
an outcome in time, the worker is replaced, and no worker process outlives the pool or the trainer."""

import asyncio
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from areal_trainer.reward.pool import WorkerPool

from ..helpers import HANG, alive, wait_dead, within

BEHAVE = "tests.plugins.behave"
BESIDE = "tests.plugins.beside"
IO_WAIT = "tests.plugins.io_wait"


def call(*args, **kwargs):
    return args, kwargs


def folder(tmp_path, name: str) -> str:
    path = tmp_path / name
    path.mkdir()
    return str(path)


def wait_for_calls(path: str, n: int) -> None:
    """Wait until ``n`` calls of :func:`tests.plugins.beside` with the folder ``path`` have started."""
    deadline = time.monotonic() + HANG
    while len([name for name in os.listdir(path) if name.isdigit()]) < n:
        assert time.monotonic() < deadline, f"{n} calls did not start"
        time.sleep(0.01)


@pytest.fixture
def pool():
    p = WorkerPool(2, timeout=1.0)
    yield p
    p.close()


def warm_pids(p: WorkerPool) -> set[int]:
    """Start both workers (and import the function); their pids."""
    out = p.map(BEHAVE, [call("pid")] * 4)
    assert all(o.status == "ok" for o in out)
    assert len(p.pids) == 2
    return set(p.pids)


def test_a_hanging_call_is_killed_at_its_deadline_and_the_others_complete(tmp_path):
    # A deadline long against scheduling delays: the second hung call must start on the other worker before the
    # first one's deadline, also on a loaded machine, to show that the two ran side by side.
    pool = WorkerPool(2, timeout=5.0)
    try:
        _hanging_calls_are_killed(pool, tmp_path)
    finally:
        pool.close()


def _hanging_calls_are_killed(pool, tmp_path):
    first = warm_pids(pool)
    hung = folder(tmp_path, "hung")
    alone = [folder(tmp_path, f"ok{k}") for k in (1, 2, 3)]
    calls = [call(alone[0], 1, "ok", 1.0), call(hung, 2, "hang"), call(alone[1], 1, "ok", 2.0), call(hung, 2, "spin"),
             call(alone[2], 1, "ok", 3.0)]
    t0 = time.monotonic()
    out = within(HANG, pool.map, BESIDE, calls)
    assert [o.status for o in out] == ["ok", "timeout", "ok", "timeout", "ok"]
    assert [o.value for o in out] == [1.0, None, 2.0, None, 3.0]
    assert out[1].detail == out[3].detail == "killed after 5.0 s"
    assert time.monotonic() - t0 >= 5.0
    assert len([n for n in os.listdir(hung) if n.startswith("met-")]) == 2  # both hung calls ran side by side
    assert pool.restarts == 2
    assert all(wait_dead(pid) for pid in first)  # killed, not abandoned
    later = pool.map(BEHAVE, [call("pid")] * 4)
    assert all(o.status == "ok" for o in later)
    assert not {o.value for o in later} & first  # served by the replacements


@pytest.mark.parametrize("mode, status, detail", [
    ("raise", "error", r"^ValueError: cannot parse the completion \(plugins.py:\d+, in behave\)$"),
    ("sys_exit", "error", r"^SystemExit: 3"),
    ("exit", "died", r"^worker process died \(exit code 1\)$"),
    ("segfault", "died", r"^worker process died \(signal 11, SIGSEGV\)$"),
    ("oom_kill", "died", r"^worker process died \(signal 9, SIGKILL\)$"),
])
def test_each_failure_is_contained_with_its_status(mode, status, detail):
    with WorkerPool(1, timeout=10.0) as pool:
        out = pool.map(BEHAVE, [call("ok", 1.0), call(mode), call("ok", 2.0)])
        assert [o.status for o in out] == ["ok", status, "ok"]
        assert [out[0].value, out[2].value] == [1.0, 2.0]
        assert re.match(detail, out[1].detail), out[1].detail
        assert pool.restarts == (1 if status == "died" else 0)  # an exception keeps its worker


def test_close_leaves_no_worker_alive_also_after_timeouts(tmp_path):
    pool = WorkerPool(2, timeout=1.0)
    seen = warm_pids(pool)
    pid_file = tmp_path / "child.pid"
    out = pool.map("tests.plugins.hang_with_child", [call(str(pid_file))])
    assert out[0].status == "timeout"
    assert wait_dead(int(pid_file.read_text()))  # the reward's own subprocess was killed with its worker
    out = pool.map(BEHAVE, [call("pid"), call("hang"), call("pid")])
    seen |= {o.value for o in out if o.status == "ok"} | set(pool.pids)
    pool.close()
    pool.close()  # idempotent
    assert pool.pids == []
    assert not [pid for pid in seen if alive(pid)]
    with pytest.raises(RuntimeError, match="closed"):
        pool.map(BEHAVE, [call("ok")])


def test_close_during_a_map_ends_it_and_its_workers(tmp_path):
    pool = WorkerPool(2, timeout=None)
    pids = warm_pids(pool)
    out = []
    hung, later = folder(tmp_path, "hung"), folder(tmp_path, "later")
    calls = [call(hung, 1, "hang"), call(hung, 1, "hang"), call(later, 1, "ok")]
    running = threading.Thread(target=lambda: out.extend(pool.map(BESIDE, calls)))
    running.start()
    wait_for_calls(hung, 2)  # both workers hang in a call, the third call waits for one
    pool.close()
    running.join(HANG)
    assert not running.is_alive()
    assert [o.status for o in out] == ["died"] * 3 and out[0].detail == "the worker pool was closed during the call"
    assert pool.pids == [] and not [pid for pid in pids if alive(pid)]


def test_async_calls_run_concurrently_in_each_worker(pool):
    assert pool.map(IO_WAIT, [call(0.0)])[0].status == "ok"  # workers started
    # Each call returns once two calls were inside its worker at once: one at a time, each would time out.
    out = pool.map("tests.plugins.io_meet", [call()] * 64)
    assert [o.status for o in out] == ["ok"] * 64 and max(o.value for o in out) >= 2


def test_async_timeouts_cancel_one_call_or_kill_a_blocked_worker(pool):
    pool.map(IO_WAIT, [call(0.0)])
    out = pool.map(IO_WAIT, [call(0.05)] * 3 + [call(0.0, "hang")] + [call(0.05)] * 3)
    assert [o.status for o in out] == ["ok"] * 3 + ["timeout"] + ["ok"] * 3
    assert out[3].detail == "cancelled after 1.0 s" and pool.restarts == 0  # cancelled inside the worker
    out = within(HANG, pool.map, IO_WAIT, [call(0.05)] * 3 + [call(0.0, "block")] + [call(0.05)] * 3)
    assert [o.status for o in out] == ["ok"] * 3 + ["timeout"] + ["ok"] * 3  # innocent calls sent again
    assert out[3].detail == "killed after 1.0 s: it blocked the event loop of its worker"
    assert pool.restarts == 1


def test_amap_does_not_block_the_event_loop(pool):
    async def main():
        ticks, done = 0, False

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += not done

        ticker = asyncio.ensure_future(tick())
        out = await pool.amap(BEHAVE, [call("ok"), call("hang")])
        done = True
        ticker.cancel()
        return out, ticks

    out, ticks = asyncio.run(main())
    assert [o.status for o in out] == ["ok", "timeout"]
    assert ticks > 0  # the loop ran on while the pool waited (a blocked loop ticks only once amap is done)


def test_workers_0_runs_in_process_and_still_catches():
    pool = WorkerPool(0, timeout=0.5)
    out = pool.map(BEHAVE, [call("pid"), call("raise"), call("sys_exit"), call("nan")])
    assert out[0].value == os.getpid()
    assert [o.status for o in out[1:]] == ["error", "error", "ok"]
    assert out[2].detail.startswith("SystemExit: 3")
    out = pool.map(IO_WAIT, [call(0.0), call(0.0, "hang"), call(0.0, "raise")])
    assert [o.status for o in out] == ["ok", "timeout", "error"]
    assert pool.map("tests.plugins.no_such_function", [call()])[0].status == "error"
    assert pool.pids == [] and pool.restarts == 0


def test_workers_that_cannot_start_fail_the_calls_instead_of_looping():
    with WorkerPool(1, timeout=1.0, start_timeout=0.001) as pool:
        out = pool.map(BEHAVE, [call("ok")] * 2)
        assert [o.status for o in out] == ["died"] * 2
        assert out[0].detail == ("the areal-reward worker process failed 3 times in a row before it could take a "
                                 "call: it did not start within 0.001 s")
        assert pool.restarts == 3


def test_a_missing_function_is_an_error_of_each_call(pool):
    out = pool.map("tests.plugins.no_such_function", [call("ok")] * 3)
    assert [o.status for o in out] == ["error"] * 3
    assert "has no attribute 'no_such_function'" in out[0].detail


def test_workers_exit_by_themselves_when_the_trainer_dies(tmp_path):
    # A "trainer" that starts two workers, leaves one stuck in a call, and dies without cleaning up.
    hung = folder(tmp_path, "hung")
    script = textwrap.dedent(f"""
        import os, threading, time
        from areal_trainer.reward.pool import WorkerPool
        pool = WorkerPool(2, timeout=None)
        pool.map({BEHAVE!r}, [(("pid",), {{}})] * 2)
        print(*pool.pids, flush=True)
        threading.Thread(target=pool.map, args=({BESIDE!r}, [(({hung!r}, 1, "hang"), {{}})]), daemon=True).start()
        while not [name for name in os.listdir({hung!r}) if name.isdigit()]:  # the call runs in its worker
            time.sleep(0.01)
        os._exit(0)
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG, env=env)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    assert all(wait_dead(pid) for pid in pids)
