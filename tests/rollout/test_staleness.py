"""The staleness manager: AReaL's capacity rule with the reference's unit-test numbers, the
lifecycle counters, resume, and thread safety."""

import threading

import pytest

from areal_trainer.rollout.staleness import StalenessManager


def manager(eta=2, bs=4, concurrent=100, **kw):
    return StalenessManager(max_head_offpolicyness=eta, consumer_bs=bs, max_concurrent=concurrent, **kw)


def test_reference_examples():
    m = manager(eta=2, bs=4)
    assert m.capacity() == 12  # (2 + 0 + 1) * 4, nothing running
    m.set_version(5)
    assert m.capacity() == 32  # (2 + 5 + 1) * 4
    assert manager(eta=2, bs=4, concurrent=5).capacity() == 5
    m = manager(eta=2, bs=4, concurrent=5)
    m.on_submitted(3)
    assert m.capacity() == 2  # max_concurrent 5 with 3 running
    sync = manager(eta=0, bs=8)
    assert sync.capacity() == 8 and sync.capacity(version=5) == 48


def test_initial_capacity_is_the_smaller_limit():
    for eta, bs, conc in [(0, 1, 1), (1, 4, 3), (3, 2, 100), (4, 8, 20)]:
        assert manager(eta, bs, conc).capacity() == min(conc, (eta + 1) * bs)


def test_running_and_accepted_are_subtracted_and_capacity_can_be_negative():
    m = manager(eta=1, bs=4)  # 8 at version 0
    m.on_submitted(6)
    assert m.capacity() == 2
    m.on_accepted(6)
    assert m.capacity() == 2  # accepted count like running ones
    m.on_submitted(2)
    m.on_accepted(2)
    assert m.capacity() == 0
    m.on_submitted(3)  # more than the rule allows (the caller must not): capacity goes negative
    assert m.capacity() == -3


def test_rejected_groups_do_not_use_capacity_unless_attempts_are_consumed():
    m = manager(eta=0, bs=4)
    m.on_submitted(4)
    m.on_rejected(4)
    assert m.capacity() == 4 and m.counts().rejected == 4
    attempts = manager(eta=0, bs=4, count_rejected=True)  # dynamic_bs: the trainer consumes attempts
    attempts.on_submitted(4)
    attempts.on_rejected(4)
    assert attempts.capacity() == 0


def test_lifecycle_counters():
    m = manager()
    m.on_submitted(5)
    m.on_accepted(2)
    m.on_rejected(1)
    c = m.counts()
    assert (c.submitted, c.running, c.accepted, c.rejected, c.version) == (5, 2, 2, 1, 0)


@pytest.mark.parametrize("version", [0, 5, 10, 50])
def test_version_recovered_restores_the_steady_state(version):
    m = manager(eta=2, bs=4)
    m.on_version_recovered(version)
    assert m.capacity() == (2 + 1) * 4  # (eta + 1) * bs - running, no burst
    m.on_submitted(3)
    assert m.capacity() == (2 + 1) * 4 - 3


def test_minimum_of_one_for_concurrency_and_batch():
    m = StalenessManager(max_head_offpolicyness=0, consumer_bs=0, max_concurrent=0)
    assert m.capacity() == 1


def test_negative_eta_is_rejected():
    with pytest.raises(ValueError, match="max_head_offpolicyness"):
        manager(eta=-1)


def test_thread_safety():
    m = manager(eta=3, bs=1000, concurrent=10**9)

    def work():
        for _ in range(2000):
            m.on_submitted()
            m.on_accepted()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = m.counts()
    assert (c.submitted, c.running, c.accepted) == (16000, 0, 16000)
