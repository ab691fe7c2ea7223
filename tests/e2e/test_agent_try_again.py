"""The "try again" agent example (examples/agents/try_again) through the real command line: two short
steps with the example's config, every episode run and counted, one row per episode (with
``rollout.chat_template_type=concat`` no call falls back), and with ``hf`` the concat export's
fallbacks reported."""

import json
import os

import pytest

from .helpers import ROOT, cli

EXAMPLE_DIR = os.path.join(ROOT, "examples", "agents", "try_again")


@pytest.mark.parametrize("template", ["concat", "hf"])
def test_try_again_agent_example_runs(tmp_path, template):
    proc = cli(["--config-dir", EXAMPLE_DIR, "--config-name", "try_again", "+scale=tiny", "trial_name=t",
                f"rollout.chat_template_type={template}"], cwd=tmp_path)
    run_dir = tmp_path / "outputs" / "try_again_agent" / "t"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["agent/episodes"] == 4.0  # tiny: 2 prompts x 2 episodes
        assert r["agent/errors"] == 0.0 and r["agent/timeouts"] == 0.0
        assert 4.0 <= r["agent/calls"] <= 8.0  # at most max_turns=2 calls per episode
        # A fallback is a later call whose prompt did not extend its episode's row: it starts a row of its own.
        assert r["agent/concat_fallbacks"] <= r["agent/calls"] - r["agent/episodes"]
        assert r["rollout/rows"] == r["agent/episodes"] + r["agent/concat_fallbacks"]
        assert r["agent/chat_template_fallbacks"] == 0.0  # every later call extends the one before it
        if template == "concat":  # the sampled ids continued: one row per episode, as the workflow's
            assert r["agent/concat_fallbacks"] == 0.0 and r["rollout/rows"] == 4.0
    if template == "hf":  # the built-in template re-renders an answer without the model's <eos>
        assert sum(r["agent/concat_fallbacks"] for r in steps) > 0
    assert any("eval/accuracy" in r for r in records)
    assert "held-out accuracy" in proc.stdout
