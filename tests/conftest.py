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
import signal  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

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


def pytest_collection_modifyitems(config, items):
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if _runs_the_command_line(item):
            item.add_marker(pytest.mark.e2e)
        if skip is not None and "gpu" in item.keywords:
            item.add_marker(skip)
