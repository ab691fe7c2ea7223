"""Whether this machine can box generated code (``reward/box/namespaces.py``), probed once: tests of code
rewards that isolate are marked :data:`needs_isolation` and skipped, with the kernel's reason, where it
cannot (a container runtime's seccomp profile, user namespaces off), as GPU tests are without a GPU.
On such a machine code rewards refuse to start; ``tests/reward/test_box.py`` checks that refusal everywhere."""

import pytest

from areal_trainer.reward.code import _probe

FOUND = _probe(512)
needs_isolation = pytest.mark.skipif("error" in FOUND, reason=f"no isolation for generated code here: "
                                                              f"{FOUND.get('error')}")
