"""Whether this machine can box generated code (``reward/box/namespaces.py``), probed once: tests of code
rewards that isolate are marked :data:`needs_isolation` and skipped, with the kernel's reason, where it
cannot (a container runtime's seccomp profile, user namespaces off), as GPU tests are without a GPU;
a box that fails for any other reason fails them.
On such a machine code rewards refuse to start; ``tests/reward/test_box.py`` checks that refusal everywhere."""

import pytest

from areal_trainer.reward.code import _probe

FOUND = _probe(512)
KERNEL_REFUSALS = ("Operation not permitted", "Permission denied", "No space left", "Invalid argument")
REFUSED = "IsolationError" in FOUND.get("error", "") and any(why in FOUND["error"] for why in KERNEL_REFUSALS)
"""Skipped only where the kernel refused a step: any other failure of the box is a bug, and its tests fail."""
needs_isolation = pytest.mark.skipif(REFUSED, reason=f"no isolation for generated code here: {FOUND.get('error')}")
