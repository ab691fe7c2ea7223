"""Every metric key a run logs is in docs/metrics.md: those of every preset (the golden records hold every
per-step key of each), and (tests/e2e/conftest.py) those of every run the end-to-end tests make."""

import json
import os

from .metrics_doc import documented, undocumented

GOLDEN = os.path.join(os.path.dirname(__file__), "e2e", "golden_presets.json")


def test_the_reader_of_the_doc_expands_alternatives_and_placeholders():
    assert documented("critic/update/grad_norm") and documented("staleness/frac_3")
    assert documented("reward/gsm8k_reward_fn") and documented("eval/reward/gsm8k_reward_fn")
    assert documented("eval/agent/tool_calls") and documented("agent/bad_requests")
    assert not documented("agent/no_such_key") and not documented("eval/actor/entropy")


def test_every_key_of_every_preset_is_documented():
    with open(GOLDEN) as f:
        runs = json.load(f)["runs"]
    keys = {k for records in runs.values() for r in records for k in r}
    assert undocumented(keys) == []
