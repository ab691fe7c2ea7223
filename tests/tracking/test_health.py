"""Run health warnings: a rate that rises well above its start, an entropy collapse, answers that stop at
the token budget; each warned once, with the numbers."""

from areal_trainer.tracking.health import HealthMonitor, rates


def _agent(failures: float, calls_read: float = 122.0, truncated: float = 0.0, calls: float = 130.0) -> dict:
    return {"agent/tool_parse_failures": failures, "agent/tool_calls": calls_read, "agent/calls": calls,
            "agent/truncated": truncated, "agent/concat_fallbacks": 0.0}


def _feed(monitor, records, first=1):
    return [w for step, r in enumerate(records, first) for w in monitor.observe(step, r)]


def test_parse_failures_that_rise_from_6_to_48_percent_warn_once_naming_the_numbers():
    # Steps 1-5: 8 unreadable of 8 + 122 calls = 6.2%; steps 6-10: 62 of 62 + 68 = 47.7%.
    records = [_agent(8)] * 5 + [_agent(62, calls_read=68)] * 5 + [_agent(100, calls_read=30)] * 5
    warnings = _feed(HealthMonitor(max_new_tokens=40), records)
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: step 10: tool calls the parser could not read "
                                  "(agent/tool_parse_failures) rose from 6% (steps 1-5) to 48% (steps 6-10).")
    assert "Reward hacking" in warnings[0] and "samples.jsonl" in warnings[0]


def test_a_rate_that_doubles_but_stays_small_or_grows_by_less_than_double_is_quiet():
    small = [_agent(4)] * 5 + [_agent(12, calls_read=118)] * 10       # 3% -> 9%: x3 but +6 points
    high = [_agent(50, calls_read=80)] * 5 + [_agent(80, calls_read=50)] * 10  # 38% -> 62%: +23 points, x1.6
    assert _feed(HealthMonitor(), small) == [] and _feed(HealthMonitor(), high) == []


def test_most_answers_at_the_token_budget_warn_at_once_with_the_key_to_raise():
    warnings = _feed(HealthMonitor(max_new_tokens=16), [_agent(0, truncated=117)] * 3)
    assert warnings == ["warning: step 1: 90% of the agent calls (117 of 130) stopped at gconfig.max_new_tokens=16: "
                        "they are cut before they end (a tool call or a final answer cut short cannot be read). "
                        "Raise gconfig.max_new_tokens, or look at the completions in samples.jsonl for answers "
                        "that do not stop."]
    rows = {"rollout/truncated_frac": 0.75, "rollout/rows": 128.0}  # a workflow run: the rows trained on
    assert "75% of the answers (96 of 128) stopped at gconfig.max_new_tokens=8" in HealthMonitor(
        max_new_tokens=8).observe(3, rows)[0]
    assert HealthMonitor().observe(1, {"rollout/truncated_frac": 0.5, "rollout/rows": 128.0}) == []


def test_cut_answers_that_creep_up_warn_as_a_drift():
    records = [{"rollout/truncated_frac": 0.02, "rollout/rows": 128.0}] * 5 + \
              [{"rollout/truncated_frac": 0.30, "rollout/rows": 128.0}] * 5
    (warning,) = _feed(HealthMonitor(), records)
    assert warning.startswith("warning: step 10: answers cut at gconfig.max_new_tokens (agent/truncated, "
                              "rollout/truncated_frac) rose from 2% (steps 1-5) to 30% (steps 6-10).")


def test_an_entropy_collapse_warns_once_and_a_slow_decline_does_not():
    collapse = [{"actor/entropy": 1.0}] * 5 + [{"actor/entropy": 0.15}] * 6
    (warning,) = _feed(HealthMonitor(), collapse)
    assert warning.startswith("warning: step 10: the policy's entropy (actor/entropy) fell from 1 (steps 1-5) to "
                              "0.15 (steps 6-10), below 20% of its start.")
    decline = [{"actor/entropy": 1.0 - 0.05 * k} for k in range(15)]  # 0.9 at the start, 0.4 at the end
    assert _feed(HealthMonitor(), decline) == []


def test_the_same_records_give_the_same_warnings_as_on_resume():
    records = [_agent(8)] * 5 + [_agent(62, calls_read=68)] * 5
    assert _feed(HealthMonitor(), records) == _feed(HealthMonitor(), records)


def test_the_bar_shows_the_agent_rates_only_for_agent_runs():
    assert rates(_agent(13, calls_read=117, truncated=26)) == {"tool_fail": 0.1, "cut": 0.2}
    assert rates({"rollout/truncated_frac": 0.5, "rollout/rows": 10.0}) == {}
