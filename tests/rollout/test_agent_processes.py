"""``rollout.agent_processes``: an HTTP-form agent's episodes in processes of their own (``processes.py``,
``process_main.py``). What an agent does to its process (raise, crash, block its loop, print, return what
cannot be sent) ends as that episode's failure, named, and the next episode finds a working process."""

import asyncio
import glob
import os

import pytest

from areal_trainer.errors import UserError
from areal_trainer.rollout.agents.loop import describe
from areal_trainer.rollout.agents.processes import AgentProcessError, AgentProcesses, check
from areal_trainer.rollout.agents.spec import load_agent

AGENTS = "tests.agents.in_processes."
KW = {"base_url": "http://127.0.0.1:1/v1", "api_key": "sk-test"}


def _processes(name: str, n: int = 2, **kwargs) -> AgentProcesses:
    return AgentProcesses.of(load_agent(AGENTS + name, kwargs), n)


async def _episodes(procs: AgentProcesses, xs, timeout: float | None = None) -> list:
    """Each row's result, or the description of its failure (as the trainer reports it)."""
    async def one(i, x):
        try:
            async with asyncio.timeout(timeout):
                return await procs.run(i, {"x": x}, KW)
        except TimeoutError:
            return "timeout"
        except AgentProcessError as e:
            return describe(e)

    return await asyncio.gather(*(one(i, x) for i, x in enumerate(xs)))


def _run(coro):
    return asyncio.run(coro)


def test_episodes_run_in_their_processes_which_load_no_torch_and_whose_prints_do_not_reach_the_pipe():
    async def go():
        procs = _processes("double")
        try:
            doubled = await _episodes(procs, [1, 2, 3, 4])
            where = _processes("where", 2)
            try:
                places = [await where.run(i, {"x": 0}, {**KW, "api_key": f"sk-{i}"}) for i in range(4)]
            finally:
                where.close()
        finally:
            procs.close()
        return doubled, places

    doubled, places = _run(go())
    assert doubled == [2.0, 4.0, 6.0, 8.0]
    assert [p["api_key"] for p in places] == ["sk-0", "sk-1", "sk-2", "sk-3"]
    assert all(p["base_url"] == KW["base_url"] and p["torch"] is False for p in places)
    pids = [p["pid"] for p in places]
    assert pids[0] == pids[2] != pids[1] == pids[3] and os.getpid() not in pids  # episode i in process i mod 2


def test_an_agent_that_raises_fails_its_episode_with_the_agents_frames():
    procs = _processes("boom")
    try:
        out = _run(_episodes(procs, [0, 1]))
    finally:
        procs.close()
    assert out[0].endswith("ValueError: boom 0") and out[1].endswith("ValueError: boom 1")
    assert "in_processes.py" in out[0] and "in boom" in out[0] and "process_main" not in out[0]


def test_a_crash_fails_the_episodes_of_its_process_only_and_the_next_episode_gets_a_new_process():
    async def go():
        procs = _processes("crash")
        try:
            first = await _episodes(procs, [0, 1, 2, 3])  # x=1 runs in process 1, with x=3
            again = await _episodes(procs, [0, 0, 0, 0])
        finally:
            procs.close()
        return first, again, procs.restarts

    first, again, restarts = _run(go())
    assert first[0] == first[2] == 1.0
    assert first[1] == first[3] and "ended: exit code 3" in first[1] and "agent process (pid " in first[1]
    assert again == [1.0] * 4 and restarts == 1


def test_a_result_that_cannot_be_sent_is_named():
    procs = _processes("unpicklable", 1)
    try:
        (out,) = _run(_episodes(procs, [0]))
    finally:
        procs.close()
    assert out.startswith("the agent returned a function that cannot be sent to the trainer")
    assert "return a float or {completion_id: reward}" in out


def test_a_plain_def_agent_runs_in_a_thread_of_its_process():
    procs = _processes("plain")
    try:
        assert _run(_episodes(procs, [3, 4])) == [3.0, 4.0]
    finally:
        procs.close()


def test_a_class_agent_is_built_once_per_process_and_closed_when_the_run_ends(tmp_path):
    closed = str(tmp_path / "closed")
    procs = _processes("Counter", 2, start=10, closed_to=closed)
    out = _run(_episodes(procs, range(6)))
    popens = [p.proc for p in procs._procs]
    procs.close()
    assert out == [11.0, 11.0, 12.0, 12.0, 13.0, 13.0]
    assert all(p.poll() == 0 for p in popens)
    assert sorted(open(f).read() for f in glob.glob(closed + ".*")) == ["13", "13"]


def test_a_timed_out_episode_is_cancelled_in_its_process_which_goes_on():
    async def go():
        procs = _processes("slow", 1)
        try:
            out = await _episodes(procs, [0, 1], timeout=0.3)
            await asyncio.sleep(0.3)
            answered = not procs._procs[0].cancelled
            await procs.begin()
            return out, answered, procs._procs[0].ended, procs.restarts
        finally:
            procs.close()

    out, answered, ended, restarts = _run(go())
    assert out == ["timeout", "timeout"] and answered and ended is None and restarts == 0


def test_a_process_whose_loop_an_agent_blocks_is_killed_before_the_next_rollout_and_replaced():
    async def go():
        procs = _processes("blocks", 1)
        try:
            out = await _episodes(procs, [0], timeout=0.3)
            pid = procs._procs[0].proc.pid
            await procs.begin()
            killed = procs._procs[0].ended
            return out, pid, killed, procs
        except BaseException:
            procs.close()
            raise

    out, pid, killed, procs = _run(go())
    procs.close()
    assert out == ["timeout"]
    assert f"(pid {pid}) did not end cancelled episodes" in killed and "was killed" in killed


def test_an_agent_that_cannot_be_set_up_in_its_process_fails_every_episode_without_a_new_process_each_time():
    procs = AgentProcesses(AGENTS + "missing", {}, 1)
    try:
        out = _run(_episodes(procs, [0, 1, 2]))
    finally:
        procs.close()
    assert len(set(out)) == 1 and out[0].startswith("the agent could not be set up in its process")
    assert "has no attribute 'missing'" in out[0] and procs.restarts == 0


def test_the_count_of_processes_is_checked_with_the_key_and_the_fix():
    http = load_agent(AGENTS + "double", {})
    client = load_agent("tests.agents.two_forms.run_client", {})
    assert check(http, 2) is None and check(client, 0) is None
    assert "rollout.agent_processes: got -1; must be an integer >= 0" in check(http, -1)
    assert "rollout.agent_processes: got 'two'" in check(http, "two")
    message = check(client, 2)
    assert "takes a client (the in-process form)" in message and "rollout.agent_processes=0" in message
    with pytest.raises(UserError, match="takes a client"):
        AgentProcesses.of(client, 1)
    assert AgentProcesses.of(http, 0) is None


def test_a_process_whose_agent_blocks_its_loop_ends_by_itself_when_the_trainer_is_gone():
    """The end of its input (the trainer died) ends a process even when the agent blocks its loop, ``CLOSE_S`` + 5
    seconds later (0.5 s here: the test sets ``CLOSE_S`` in the process)."""
    import subprocess
    import sys
    import time

    from areal_trainer.rollout.agents.process_main import read_frame, write_frame

    code = ("import areal_trainer.rollout.agents.process_main as m, sys; m.CLOSE_S = -4.5; sys.exit(m.main())")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    write_frame(proc.stdin, ("start", {"path": AGENTS + "blocks", "kwargs": {}, "sys_path": sys.path}))
    assert read_frame(proc.stdout)[0] == "ready"
    write_frame(proc.stdin, ("run", 0, {"x": 0}, KW))
    time.sleep(0.5)
    proc.stdin.close()  # as when the trainer is killed
    start = time.monotonic()
    assert proc.wait(timeout=20) == 1 and time.monotonic() - start < 10
