"""The end-to-end tests' waiting helper judges a run on its state when it ended: a run that reaches what a
test waits for and ends at once is not reported as ended before it, and one that ends short of it is."""

from __future__ import annotations

import io

import pytest

from .helpers import wait_until


class _EndsWhenPolled:
    """A run that reaches the awaited state and exits in the instant between two looks at it: its first
    ``poll`` finds it ended with the state reached."""

    def __init__(self, reaches: bool):
        self.reaches, self.reached, self.returncode = reaches, False, None
        self.stderr = io.StringIO("the run's last words")

    def poll(self):
        self.reached, self.returncode = self.reaches, -9
        return self.returncode


def test_a_run_that_reaches_the_state_as_it_ends_is_not_an_error():
    proc = _EndsWhenPolled(reaches=True)
    wait_until(lambda: proc.reached, proc, "the state", timeout=5)


def test_a_run_that_ends_short_of_the_state_fails_with_its_exit_and_stderr():
    proc = _EndsWhenPolled(reaches=False)
    with pytest.raises(AssertionError, match=r"(?s)ended \(exit -9\) before the state.*last words"):
        wait_until(lambda: proc.reached, proc, "the state", timeout=5)


def test_a_run_that_never_reaches_the_state_times_out():
    class Going:
        stderr = None

        def poll(self):
            return None

    with pytest.raises(AssertionError, match="no the state after 0.05 s"):
        wait_until(lambda: False, Going(), "the state", timeout=0.05)
