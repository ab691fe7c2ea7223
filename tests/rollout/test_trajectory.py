"""An episode's calls as rows: discounted per-call rewards (hand-derived), individual and concat export,
and the exact-prefix rule that keeps a merged row's ids equal to the ids sampled."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_trainer.rollout.agents.session import CallRecord
from areal_trainer.rollout.agents.trajectory import discounted_rewards, export_rows
from areal_trainer.rollout.rows import make_row


def _rec(call, prompt, output, index=0, cid=None):
    return CallRecord(cid or f"c{call}", index, call, list(prompt), list(output),
                      [-0.5 - k for k in range(len(output))], [call] * len(output), False)


def test_discounted_rewards_are_returns_from_each_call():
    # r = [None, 0.5, 1.0], gamma = 0.9: r2 = 1; r1 = 0.5 + 0.9 * 1 = 1.4; r0 = 0 + 0.9 * 1.4 = 1.26
    assert discounted_rewards([None, 0.5, 1.0], 0.9) == pytest.approx([1.26, 1.4, 1.0])
    assert discounted_rewards([None, None, 2.0], 1.0) == [2.0, 2.0, 2.0]
    assert discounted_rewards([3.0], 0.5) == [3.0]


@given(st.lists(st.one_of(st.none(), st.floats(-5, 5)), min_size=1, max_size=8), st.floats(0.01, 1.0))
def test_discounted_rewards_match_the_definition(rewards, gamma):
    out = discounted_rewards(rewards, gamma)
    r = [0.0 if x is None else x for x in rewards]
    for i in range(len(r)):
        assert out[i] == pytest.approx(sum(gamma ** (j - i) * r[j] for j in range(i, len(r))), abs=1e-9)


def test_individual_export_makes_one_row_per_call_with_its_return():
    recs = [_rec(0, [1, 2], [3, 4]), _rec(1, [1, 2, 3, 4, 9], [5])]
    rows, fallbacks = export_rows(recs, [0.9, 1.0], "individual")
    assert fallbacks == 0 and [r.reward for r in rows] == [0.9, 1.0] and [r.calls for r in rows] == [1, 1]
    row = make_row(rows[1].segments)
    assert row["input_ids"].tolist() == [1, 2, 3, 4, 9, 5]
    assert row["loss_mask"].tolist() == [0, 0, 0, 0, 0, 1]
    assert row["logprobs"].tolist() == [0, 0, 0, 0, 0, -0.5]


def test_concat_merges_calls_that_extend_the_row_exactly():
    recs = [_rec(0, [1, 2], [3, 4]), _rec(1, [1, 2, 3, 4, 7, 8], [5, 6])]
    rows, fallbacks = export_rows(recs, [0.81, 0.9], "concat")
    assert fallbacks == 0 and len(rows) == 1 and rows[0].calls == 2 and rows[0].reward == 0.81
    row = make_row(rows[0].segments)
    assert row["input_ids"].tolist() == [1, 2, 3, 4, 7, 8, 5, 6]  # = the last call's prompt + output
    assert row["loss_mask"].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert row["turn_ids"].tolist() == [-1, -1, 0, 0, -1, -1, 1, 1]
    assert row["versions"].tolist() == [-1, -1, 0, 0, -1, -1, 1, 1]


def test_concat_falls_back_to_separate_rows_when_the_prompt_does_not_extend_the_row():
    # The second prompt drops the first answer's first token (as a template that strips reasoning does).
    recs = [_rec(0, [1, 2], [3, 4]), _rec(1, [1, 2, 4, 7], [5])]
    rows, fallbacks = export_rows(recs, [1.0, 1.0], "concat")
    assert fallbacks == 1 and len(rows) == 2
    assert [make_row(r.segments)["input_ids"].tolist() for r in rows] == [[1, 2, 3, 4], [1, 2, 4, 7, 5]]


def test_concat_continues_the_choice_the_agent_kept():
    # n = 2 on the first call; the agent continues choice 1: that choice's row grows, choice 0 stays alone.
    recs = [_rec(0, [1], [2], 0, "a"), _rec(0, [1], [3], 1, "a"), _rec(1, [1, 3, 9], [4])]
    rows, fallbacks = export_rows(recs, [0.0, 0.0, 1.0], "concat")
    assert fallbacks == 0 and [make_row(r.segments)["input_ids"].tolist() for r in rows] == [[1, 2], [1, 3, 9, 4]]
