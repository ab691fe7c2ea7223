"""Test-wide settings: offline hubs, no wandb, few threads (timings on shared CPUs are noisy); markers:
``e2e`` for every test that runs the real command line (everything in tests/e2e/, and any test that calls
``cli``/``popen``), so that ``-m "not e2e"`` is the fast inner loop; ``gpu`` tests are skipped without CUDA;
the fixture ``tok``, the built-in tokenizer."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("AREAL_TRAINER_CACHE", os.path.join(tempfile.gettempdir(), "areal_trainer_test_cache"))

import inspect  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

# CI (CI=true) draws the same examples in every run, so that its verdict is the code's, not the draw's; other
# runs draw new ones each time (and keep a failing example in .hypothesis/, drawn first next time).
hypothesis_settings.register_profile("ci", derandomize=True)
if os.environ.get("CI") == "true":
    hypothesis_settings.load_profile("ci")

# Two threads at most; one in each of several pytest-xdist workers (scripts/test.sh runs two), so
# that the workers' kernels do not wait at OpenMP barriers for threads the other worker holds.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))

# A suite started in the background of a non-interactive shell (``pytest ... &``, nohup) inherits SIGINT
# ignored, and so would every run it starts: the tests' Ctrl-C would then go unheard (the run ends with 0, or
# not at all). Python turns a default SIGINT into KeyboardInterrupt, so the runs get the terminal's behaviour.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="module")
def tok():
    """The built-in tokenizer, one per test module."""
    from areal_trainer.model.builtin import build_tokenizer

    return build_tokenizer()


def _runs_the_command_line(item) -> bool:
    if "/tests/e2e/" in str(item.fspath).replace("\\", "/"):
        return True
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        return False
    return "cli(" in source or "popen(" in source


UNMEASURED = 20.0
"""Seconds counted for an end-to-end test file that ``tests/durations.json`` does not name yet."""


def _file_seconds() -> dict[str, float]:
    """Each test file's seconds in a measured run of the suite (``scripts/test_durations.py`` writes them)."""
    try:
        with open(os.path.join(os.path.dirname(__file__), "durations.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _longest_files_first(items) -> None:
    """Order the files longest first (each file's tests keep their order): two pytest-xdist workers given the
    files in this order (``scripts/test.sh``) start the long end-to-end files at once, instead of one
    worker ending alone with one of them."""
    seconds = _file_seconds()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def key(item) -> float:
        name = os.path.relpath(str(item.fspath), root).replace(os.sep, "/")
        return -seconds.get(name, UNMEASURED if name.startswith("tests/e2e/") else 0.0)

    items.sort(key=key)


def pytest_collection_modifyitems(config, items):
    _longest_files_first(items)
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if _runs_the_command_line(item):
            item.add_marker(pytest.mark.e2e)
        if skip is not None and "gpu" in item.keywords:
            item.add_marker(skip)
