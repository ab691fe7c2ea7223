"""The one failure policy of user code (``areal_trainer/failures.py``): the stop rule at its boundary, the one
message format of a named failure and of a stop, the metric families, and the limits bound per kind. Every
expected string is written out by hand."""

import pytest

from areal_trainer.errors import UserError
from areal_trainer.failures import DEFAULT, ENDINGS, FailurePolicy, KindPolicy, Notices, metric

POLICY = FailurePolicy.of(error_value=-1.0, timeout_value=-2.0, max_error_fraction=0.5, reward_timeout=30.0,
                          code_timeout=5.0, tool_timeout=3.0, agent_timeout=60.0)


@pytest.mark.parametrize("fraction, failed, total, stops", [
    (0.5, 2, 4, False),   # exactly half: 2 > 0.5 * 4 is false
    (0.5, 3, 4, True),    # 3 > 2
    (0.5, 1, 1, True),    # 1 > 0.5
    (0.5, 0, 1, False),
    (0.25, 1, 4, False),  # 1 > 1 is false
    (0.25, 2, 4, True),
    (0.0, 1, 10, True),   # any failure stops
    (0.0, 0, 10, False),
    (1.0, 10, 10, False),  # never stops
    (0.5, 0, 0, False),   # an empty batch
])
def test_the_stop_rule_at_its_boundary(fraction, failed, total, stops):
    policy = FailurePolicy.of(max_error_fraction=fraction).reward
    assert policy.too_many(failed, total) is stops
    assert FailurePolicy.of(max_error_fraction=fraction).agent.too_many(failed, total) is stops
    if stops:
        with pytest.raises(UserError):
            policy.check("f", failed=failed, total=total, ways="w", example="e", change="c")
    else:
        policy.check("f", failed=failed, total=total, ways="w", example="e", change="c")


def test_tools_and_code_never_stop_the_run():
    for kind in (POLICY.tool, POLICY.code):
        assert kind.max_error_fraction is None and not kind.too_many(10, 10)


def test_the_stop_message_names_the_source_the_count_the_key_the_ways_an_example_and_the_fix():
    error = POLICY.reward.stop("my.fn", failed=3, total=4, ways="2 raised, 1 returned NaN or infinity",
                               example="completion='x' -> ValueError: bad", change="Fix the function.")
    assert str(error) == ("reward source my.fn: 3 of 4 samples of one batch failed (more than "
                          "reward.max_error_fraction=0.5): 2 raised, 1 returned NaN or infinity. Example: "
                          "completion='x' -> ValueError: bad. Fix the function.")
    traceback = 'File "agent.py", line 3, in run\nRuntimeError: broke'
    error = POLICY.agent.stop("my.agent", failed=2, total=2, ways="2 raised", example=traceback, change="Fix it.")
    assert str(error) == ("rollout.agent my.agent: 2 of 2 episodes of one rollout failed (more than "
                          "reward.max_error_fraction=0.5): 2 raised. Example:\n"
                          'File "agent.py", line 3, in run\nRuntimeError: broke\nFix it.')


def test_the_notice_names_kind_source_count_of_n_counter_score_limit_and_the_first():
    assert POLICY.reward.notice("my.fn", count=2, total=8, how="raised", counter="errors",
                                example="completion='x' -> ValueError: bad") == (
        "reward source my.fn: 2 of 8 samples of this batch raised (counted in reward/errors; scored "
        "reward.error_value=-1; the run stops above reward.max_error_fraction=0.5); the first: completion='x' -> "
        "ValueError: bad")
    # timeouts never count towards the stop: the notice says how they ended and what they scored
    assert POLICY.reward.notice("my.fn", count=1, total=8, how="ran out of time", counter="timeouts",
                                example="killed after 30.0 s") == (
        "reward source my.fn: 1 of 8 samples of this batch ran out of time (counted in reward/timeouts; ended after "
        "reward.timeout=30 s (killed or cancelled); scored reward.timeout_value=-2); the first: killed after 30.0 s")
    # an agent's timeout scores reward.error_value, as an episode that raised
    assert POLICY.agent.notice("a.run", count=1, total=4, how="ran out of time", counter="timeouts", example="t") == (
        "rollout.agent a.run: 1 of 4 episodes of this rollout ran out of time (counted in agent/timeouts; ended after "
        "rollout.agent_timeout=60 s (cancelled or abandoned); scored reward.error_value=-1); the first: t")
    assert POLICY.agent.notice("a.run", count=1, total=4, how="could not be stopped", counter="abandoned",
                               example="t") == (
        "rollout.agent a.run: 1 of 4 episodes of this rollout could not be stopped (counted in agent/abandoned; a "
        "thread cannot be stopped: it is left to run, and no longer waited for); the first: t")
    # a tool has no score: the model reads its error; a tool call's own timeout is its limit when the policy has none
    assert DEFAULT.tool.notice("a.run", count=1, total=5, how="ran out of time", counter="timeouts",
                               example="'calc' abandoned after 2 s") == (
        "the tools of rollout.agent a.run: 1 of 5 tool calls of this rollout ran out of time (counted in "
        "agent/tool_timeouts; ended after client.call_tool(timeout=...) (cancelled or abandoned); the model reads the "
        "error text as the result); the first: 'calc' abandoned after 2 s")


def test_each_failure_is_named_once_per_kind_source_and_counter(capsys):
    notices = Notices()
    kw = dict(total=4, how="raised", example="e")
    assert not notices.name(POLICY.reward, "f", count=0, counter="errors", **kw)  # nothing failed: nothing named
    assert notices.name(POLICY.reward, "f", count=1, counter="errors", **kw)
    assert not notices.name(POLICY.reward, "f", count=3, counter="errors", **kw)  # once
    assert notices.name(POLICY.reward, "g", count=1, counter="errors", **kw)  # another source
    assert notices.name(POLICY.reward, "f", count=1, counter="timeouts", **kw)  # another way
    assert notices.name(POLICY.agent, "f", count=1, counter="errors", **kw)  # another kind
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and all(line.startswith("warning: ") for line in lines)
    assert lines[0] == "warning: " + POLICY.reward.notice("f", count=1, counter="errors", **kw)


def test_one_metric_family_per_kind():
    assert [POLICY.reward.metric(c) for c in POLICY.reward.counters] == ["reward/errors", "reward/timeouts"]
    assert [POLICY.agent.metric(c) for c in POLICY.agent.counters] == ["agent/errors", "agent/timeouts",
                                                                       "agent/abandoned"]
    assert [POLICY.tool.metric(c) for c in POLICY.tool.counters] == ["agent/tool_errors", "agent/tool_timeouts",
                                                                     "agent/tool_abandoned"]
    assert metric("reward", "nonfinite") == "reward/nonfinite"
    with pytest.raises(ValueError, match="no metric family"):
        POLICY.code.metric("errors")  # its outcomes are the reward's value


def test_the_settings_are_bound_per_kind():
    r, c, t, a = POLICY.reward, POLICY.code, POLICY.tool, POLICY.agent
    assert (r.timeout, r.error_value, r.timeout_value, r.max_error_fraction) == (30.0, -1.0, -2.0, 0.5)
    assert (c.timeout, c.error_value, c.ends) == (5.0, 0.0, ("killed",))
    assert (t.timeout, t.error_value, t.ends) == (3.0, None, ("cancelled", "abandoned"))
    assert (a.timeout, a.error_value, a.timeout_value, a.max_error_fraction) == (60.0, -1.0, -1.0, 0.5)
    assert r.ends == ("killed", "cancelled") and FailurePolicy.of(reward_workers=0).reward.ends == ("cancelled",)
    assert all(set(k.ends) <= set(ENDINGS) for k in (r, c, t, a))
    assert POLICY["agent"] is a and POLICY.with_timeout("agent", 2.0).agent.timeout == 2.0
    assert POLICY.with_timeout("agent", 2.0).reward is r  # the other kinds are left as they are
    assert DEFAULT == FailurePolicy.of()
    with pytest.raises(ValueError, match="max_error_fraction"):
        FailurePolicy.of(max_error_fraction=1.5)
    with pytest.raises(ValueError, match="ends"):
        KindPolicy("tool", "t", "calls", "rollout", None, "k", ("stopped",))


def test_a_code_box_must_end_before_the_reward_call_that_runs_it():
    assert POLICY.problems() == []
    assert FailurePolicy.of(reward_timeout=30.0, code_timeout=30.0).problems() == [
        "reward.kwargs.timeout: got 30; must be < reward.timeout=30 seconds: unit_tests's box runs inside a reward "
        "call, whose worker would be killed first and score every slow program reward.timeout_value. Lower "
        "reward.kwargs.timeout or raise reward.timeout."]
    assert FailurePolicy.of(reward_timeout=30.0, code_timeout=None).problems() == []  # no code reward
    assert FailurePolicy.of(reward_timeout=3.0, code_timeout=5.0, reward_workers=0).problems() == []  # nothing killed


def test_no_result_for_a_whole_batch_stops_rewards_but_not_agents():
    POLICY.reward.check_some_result("f", total=3, timeouts=2, failed=0, change="c")  # one got a reward
    POLICY.reward.check_some_result("f", total=3, timeouts=0, failed=3, change="c")  # the share rule's case
    with pytest.raises(UserError) as e:
        POLICY.reward.check_some_result("f", total=3, timeouts=2, failed=1, change="raise reward.timeout.")
    assert str(e.value) == ("reward source f: 3 of 3 samples of one batch gave no result: 2 ran past "
                            "reward.timeout=30 s and 1 failed. Training on reward.timeout_value alone teaches nothing: "
                            "raise reward.timeout.")
    POLICY.agent.check_some_result("a", total=3, timeouts=3, failed=0, change="c")  # an abandoned loop goes on
