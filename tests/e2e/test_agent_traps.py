"""What an agent run says about its own traps, through the real command line: answers that mostly stop at
gconfig.max_new_tokens (a warning naming the key), tool names the built-in tokenizer cannot spell (a warning
naming them), and refused requests (a 4xx for the agent, counted in agent/bad_requests, a warning with the
first one); nothing of a refused request is trained."""

import json

import pytest

from .helpers import cli, step_records

AGENTS = {"in_process": "tests.agents.simple.misbehaving", "http": "tests.agents.simple.misbehaving_http"}


@pytest.mark.parametrize("form", sorted(AGENTS))
def test_an_agent_run_names_its_traps_once_and_trains_only_what_was_sampled(tmp_path, form):
    proc = cli(["--config-name", "grpo", "+scale=tiny", "actor.path=builtin:tiny-tools",
                f"rollout.agent={AGENTS[form]}", "gconfig.max_new_tokens=3", "total_train_steps=2",
                "valid_dataset=null", "trial_name=t"], cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "HTTP Request:" not in out  # the HTTP libraries log at WARNING
    limit = [line for line in out.splitlines() if "stopped at gconfig.max_new_tokens=3" in line]
    assert len(limit) == 1 and limit[0].startswith("warning: step 1: ") and "Raise gconfig.max_new_tokens" in limit[0]
    spell = [line for line in out.splitlines() if "the tokenizer cannot spell" in line]
    assert len(spell) == 1 and "'search_web'" in spell[0] and "'query'" in spell[0]
    assert "tool names among them: 'search_web'" in spell[0]
    refused = [line for line in out.splitlines() if "refused" in line and line.startswith("warning: ")]
    assert len(refused) == 1 and "agent/bad_requests" in refused[0] and "the first: 404: " in refused[0]
    with open(tmp_path / "outputs" / "grpo" / "t" / "metrics.jsonl") as f:
        steps = [r for r in map(json.loads, f) if "agent/episodes" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        episodes = r["agent/episodes"]
        assert r["agent/errors"] == 0 and r["agent/bad_requests"] == 3 * episodes
        assert r["agent/calls"] == episodes and r["rollout/rows"] == episodes  # one sampled call each: one row
        assert r["agent/truncated"] == episodes


def test_a_run_whose_agent_blocks_its_event_loop_finishes_counting_and_naming_it(tmp_path):
    """``time.sleep(3600)`` inside an ``async def`` agent, once in three episodes: each such rollout is abandoned
    at ``rollout.agent_timeout`` (its episodes end as timeouts), the next one runs on a new loop."""
    proc = cli(["--config-name", "grpo", "+scale=tiny", "rollout.agent=tests.agents.simple.blocks_its_loop",
                "rollout.agent_kwargs={every: 3}", "rollout.agent_timeout=2", "total_train_steps=2",
                "valid_dataset=null", "trial_name=t"], cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "grpo" / "t")
    assert sorted(records) == [1, 2] and sum(r["agent/blocked"] for r in records.values()) >= 1
    assert sum(r["agent/timeouts"] for r in records.values()) >= 1
    lines = [x for x in proc.stderr.splitlines() if x.startswith("warning: rollout.agent tests.agents.simple.")]
    assert any("the agent blocked the episodes' event loop for more than 2 s (counted in agent/blocked)" in x
               for x in lines), proc.stderr[-3000:]


def test_an_agent_that_returns_text_once_in_five_episodes_trains_and_evaluates_to_the_end(tmp_path):
    """A non-number result is counted (agent/bad_results, eval/agent/bad_results), named once, and scored
    reward.error_value, in training and in the held-out evaluation's groups of one alike."""
    proc = cli(["--config-name", "grpo", "+scale=tiny", "rollout.agent=tests.agents.simple.bad_result_every",
                "rollout.agent_kwargs={every: 5}", "total_train_steps=2", "evaluator.freq_steps=1",
                "evaluator.eval_before_train=true", "trial_name=t"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "t"
    records = step_records(run)
    assert sorted(records) == [1, 2] and sum(r["agent/bad_results"] for r in records.values()) >= 1
    evals = step_records(run, "eval/reward")
    assert sorted(evals) == [0, 1, 2] and all(r["eval/agent/bad_results"] >= 1 for r in evals.values()), evals
    lines = [x for x in proc.stderr.splitlines() if "'no reward today'" in x]
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "agent/bad_results" in lines[0], lines
