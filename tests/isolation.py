"""Which boxes this machine can run generated code in, probed once: tests of code rewards that isolate
are marked :data:`needs_isolation` (the default box, ``isolation=auto``), :data:`needs_namespaces`
(``reward/box/namespaces.py``) or :data:`needs_landlock` (``reward/box/landlock.py``) and skipped, with
the kernel's reason, where it refuses that box (a container runtime's seccomp profile, user namespaces
off, a kernel without Landlock), as GPU tests are without a GPU; a box that fails for any other reason
fails them. Where the kernel refuses both, code rewards refuse to start; ``tests/reward/test_box.py``
checks that refusal everywhere."""

import pytest

from areal_trainer.reward.code import _probe

KERNEL_REFUSALS = ("Operation not permitted", "Permission denied", "No space left", "Invalid argument",
                   "has no Landlock", "Landlock is disabled")


def _refused(found: dict) -> bool:
    """Only where the kernel refused a step: any other failure of the box is a bug, and its tests fail."""
    error = found.get("error", "")
    return any(kind in error for kind in ("IsolationError", "LandlockError")) and any(
        why in error for why in KERNEL_REFUSALS)


FOUND = _probe(512)
NAMESPACES, LANDLOCK = _probe(512, "namespaces"), _probe(512, "landlock")
needs_isolation = pytest.mark.skipif(_refused(FOUND), reason=f"no box for generated code here: {FOUND.get('error')}")
needs_namespaces = pytest.mark.skipif(_refused(NAMESPACES), reason=f"no namespaces here: {NAMESPACES.get('error')}")
needs_landlock = pytest.mark.skipif(_refused(LANDLOCK), reason=f"no Landlock here: {LANDLOCK.get('error')}")
BOXES = [pytest.param("namespaces", marks=needs_namespaces, id="namespaces"),
         pytest.param("landlock", marks=needs_landlock, id="landlock")]
"""``isolation`` values for tests that run in each box."""


def worker_mid_call(isolation: str) -> str:
    """Source of a worker process that prints the pid of every process the code reward starts and then runs,
    in the ``isolation`` box, code that sleeps a minute: a test kills the worker mid-call and checks that the
    box dies with it."""
    return f"""
import subprocess, sys
from areal_trainer.reward import code

class Reporting(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        print(self.pid, flush=True)

code.subprocess.Popen = Reporting
code.unit_tests("p", "import time\\ntime.sleep(60)", "", tests=["assert True"], timeout=60, isolation={isolation!r})
"""
