"""Every run an end-to-end test makes has its metric keys checked against docs/metrics.md."""

import json

import pytest

from ..metrics_doc import undocumented


@pytest.fixture(autouse=True)
def metrics_are_documented(request):
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is None or getattr(request.node, "rep_call_failed", True):
        return
    keys = set()
    for path in tmp.rglob("metrics.jsonl"):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    keys.update(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by a kill
                    continue
    missing = undocumented(keys)
    assert not missing, f"metric keys missing from docs/metrics.md: {missing}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        item.rep_call_failed = outcome.get_result().failed
