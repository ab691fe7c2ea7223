"""The agents' worker threads (rollout/agents/loop.py::DaemonExecutor): reused, never blocked by a hung call,
never waited for."""

from __future__ import annotations

import asyncio
import threading
import time

from areal_trainer.rollout.agents.loop import DaemonExecutor


def _wait(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


def test_short_calls_reuse_one_worker_thread():
    ex = DaemonExecutor()
    threads = [ex.submit(threading.current_thread).result(timeout=5) for _ in range(20)]
    assert len(set(threads)) == 1  # each call waited for: the one worker was idle every time


def test_a_hung_call_does_not_delay_the_next_and_is_not_waited_for():
    ex = DaemonExecutor()
    release = threading.Event()
    hung = ex.submit(release.wait)
    t0 = time.monotonic()
    assert ex.submit(lambda: 7).result(timeout=5) == 7
    assert time.monotonic() - t0 < 5
    ex.shutdown(wait=True)  # returns at once although a call still runs
    assert not hung.done()
    release.set()
    assert hung.result(timeout=5) is True


def test_concurrent_calls_each_get_a_thread_and_exceptions_reach_the_caller():
    ex = DaemonExecutor()
    barrier = threading.Barrier(4, timeout=5)
    futures = [ex.submit(barrier.wait) for _ in range(4)]  # would deadlock on fewer than 4 threads
    assert sorted(f.result(timeout=5) for f in futures) == [0, 1, 2, 3]

    def boom():
        raise ValueError("tool failed")

    err = ex.submit(boom).exception(timeout=5)
    assert isinstance(err, ValueError) and str(err) == "tool failed"


def test_idle_workers_end_after_their_idle_time():
    ex = DaemonExecutor()
    ex.IDLE_S = 0.05
    ex.submit(lambda: None).result(timeout=5)
    _wait(lambda: not any(t.name == "areal-agent-worker" and t.is_alive() for t in threading.enumerate()
                          if getattr(t, "_target", None) == ex._worker))


def test_asyncio_to_thread_uses_it_as_the_default_executor():
    loop = asyncio.new_event_loop()
    ex = DaemonExecutor()
    loop.set_default_executor(ex)

    def workers() -> int:
        return sum(1 for t in threading.enumerate() if getattr(t, "_target", None) == ex._worker)

    async def many():
        return await asyncio.gather(*[asyncio.to_thread(threading.current_thread) for _ in range(8)])

    try:
        ran = set(loop.run_until_complete(many()))
        started = workers()
        again = loop.run_until_complete(asyncio.to_thread(threading.current_thread))
    finally:
        loop.close()
    assert ran and all(t.name == "areal-agent-worker" for t in ran) and started >= 1
    assert workers() == started and again.name == "areal-agent-worker"  # an idle worker took it: no new thread
