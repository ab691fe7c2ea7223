"""The one trajectory type: rows from sampled segments (hand-derived tensors), a workflow's dict checked and
wrapped, groups concatenated into the batch, and the row keys defined once."""

from __future__ import annotations

import ast
import dataclasses
import os

import pytest
import torch

from areal_trainer.errors import PluginOutputError
from areal_trainer.rollout.rows import KEYS, PAD_VALUES, ROW_KEYS, ROW_VALUE_KEYS, Rows, Segment, concat_rows
from areal_trainer.rollout.types import TrajectoryGroup, as_group, group_problems
from areal_trainer.train.batch import TrainBatch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _two_rows(num_turns=None) -> Rows:
    return Rows.from_segments([[Segment([5, 6]), Segment([7, 8], True, [-0.5, -0.25], [3, 4], 0)],
                               [Segment([5]), Segment([9], True, [-1.0], [2], 0), Segment([1]),
                                Segment([2], True, [-2.0], [3], 1)]],
                              rewards=[1, 0.5], truncated=[False, True], num_turns=num_turns)


def test_rows_from_segments_by_hand():
    r = _two_rows()
    assert r.input_ids.tolist() == [[5, 6, 7, 8], [5, 9, 1, 2]]
    assert r.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    assert r.loss_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 1]]
    assert r.logprobs.tolist() == [[0, 0, -0.5, -0.25], [0, -1.0, 0, -2.0]]
    assert r.turn_ids.tolist() == [[-1, -1, 0, 0], [-1, 0, -1, 1]]
    assert r.versions.tolist() == [[-1, -1, 3, 4], [-1, 2, -1, 3]]
    assert r.rewards.tolist() == [1.0, 0.5] and r.rewards.dtype == torch.float32
    assert r.is_truncated.tolist() == [False, True] and r.is_truncated.dtype == torch.bool
    assert r.num_turns is None and r.token_rewards is None and r.n_rows == 2
    assert (r.input_ids.dtype, r.turn_ids.dtype, r.versions.dtype) == (torch.long, torch.int32, torch.int32)


def test_rows_are_frozen_and_their_dict_holds_what_is_set():
    r = _two_rows(num_turns=[1, 2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.rewards = torch.zeros(2)
    assert list(r.as_dict()) == [k for k in KEYS if k != "token_rewards"]
    assert r.num_turns.tolist() == [1.0, 2.0]


def test_rows_of_unequal_lengths_are_right_padded_with_each_keys_pad():
    r = Rows.from_segments([[Segment([5]), Segment([7, 8], True, [-0.5, -0.5], [0, 0], 0)], [Segment([5, 6])]],
                           rewards=[0, 0], truncated=[False, False])
    assert r.input_ids.tolist() == [[5, 7, 8], [5, 6, PAD_VALUES["input_ids"]]]
    assert r.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert r.turn_ids[1, 2] == -1 and r.versions[1, 2] == -1 and r.logprobs[1, 2] == 0


def test_a_count_that_does_not_match_the_rows_is_refused():
    with pytest.raises(ValueError, match="2 rows need 2 rewards"):
        Rows.from_segments([[Segment([1])], [Segment([2])]], rewards=[1.0], truncated=[False, False])


def test_concat_pads_to_the_widest_and_fills_an_optional_key_a_group_lacks():
    a = _two_rows(num_turns=[1, 2])
    b = Rows.from_segments([[Segment([4]), Segment([3], True, [-0.1], [5], 0)]], rewards=[0], truncated=[False])
    out = concat_rows([a, b])
    assert out.input_ids.tolist() == [[5, 6, 7, 8], [5, 9, 1, 2], [4, 3, 0, 0]]
    assert out.versions[2].tolist() == [-1, 5, -1, -1]
    assert out.num_turns.tolist() == [1.0, 2.0, 1.0]  # a group without turn counts has one turn per row
    assert out.token_rewards is None  # no group has process rewards
    batch = TrainBatch.from_groups([TrajectoryGroup(a, prompt_id=3), TrajectoryGroup(b)], torch.device("cpu"))
    assert batch.group_sizes == (2, 1) and batch.prompt_ids == (3, None)
    assert all(torch.equal(getattr(batch, k), v) for k, v in out.as_dict().items())
    from_dicts = TrainBatch.from_groups([a.as_dict(), b.as_dict()], torch.device("cpu"))  # a workflow's dicts
    assert all(torch.equal(getattr(from_dicts, k), v) for k, v in out.as_dict().items())


def test_a_workflows_dict_is_checked_and_wrapped_and_unknown_keys_are_dropped():
    d = {**_two_rows().as_dict(), "debug": torch.zeros(2)}
    g = as_group(d)
    assert isinstance(g.rows, Rows) and "debug" not in g and list(g.keys()) == list(_two_rows().as_dict())
    assert torch.equal(g["rewards"], d["rewards"]) and g.get("num_turns") is None
    bad = {k: v for k, v in d.items() if k != "versions"}
    assert group_problems(bad, "rollout.workflow w") == ["rollout.workflow w: a trajectory group lacks versions."]
    with pytest.raises(PluginOutputError, match=r"TrajectoryGroup\(...\): rewards must be torch tensors; got list"):
        TrajectoryGroup({**d, "rewards": [1.0, 0.5]})
    with pytest.raises(TypeError):
        g.tensors["rewards"] = torch.zeros(2)  # read-only: replace the rows instead


def test_the_row_keys_are_defined_once():
    """``Rows``'s fields are the only listing of the row keys: the batch is a ``Rows``, and no module of the
    rollout spells a row key list of its own."""
    assert ROW_KEYS == ("input_ids", "attention_mask", "loss_mask", "logprobs", "turn_ids", "versions")
    assert ROW_VALUE_KEYS == ("rewards", "is_truncated")
    assert issubclass(TrainBatch, Rows)
    assert [f.name for f in dataclasses.fields(TrainBatch)][:len(KEYS)] == list(KEYS)
    for dirpath, _, files in os.walk(os.path.join(ROOT, "areal_trainer", "rollout")):
        for f in files:
            if not f.endswith(".py") or f == "rows.py":
                continue
            with open(os.path.join(dirpath, f)) as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    names = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                    assert len(names & set(KEYS)) < 3, f"{f}:{node.lineno} lists row keys: use rollout/rows.py"
