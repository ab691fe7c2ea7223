"""Batch collection with DAPO's dynamic sampling: fixed batch size keeps sampling, dynamic_bs does
not, and an unsatisfiable filter fails with a clear error after the bounded number of rounds."""

import pytest
import torch

from areal_trainer.data.loader import PromptLoader
from areal_trainer.errors import PluginOutputError, UserError
from areal_trainer.metrics import floats
from areal_trainer.rollout.filters import has_reward_variance
from areal_trainer.train.evaluate import evaluate
from areal_trainer.train.sources.collect import collect_groups

from ..groups import make_group


class FakeWorkflow:
    """Prompt i gets rewards [1, 0] when i is even (mixed) and [1, 1] when odd (uniform)."""

    def rollout(self, samples, gconfig):
        return [make_group([1.0, float(s % 2)]) for s in samples]


def _loader():
    return PromptLoader(list(range(100)), 4, shuffle=False, drop_last=True, seed=0)


def test_has_reward_variance():
    assert has_reward_variance({"rewards": torch.tensor([0.0, 1.0])})
    assert not has_reward_variance({"rewards": torch.tensor([1.0, 1.0])})


def test_fixed_batch_size_keeps_sampling_until_full():
    batch = collect_groups(_loader(), FakeWorkflow(), None, batch_size=4, accept=has_reward_variance,
                           dynamic_bs=False, max_rounds=8)
    m = floats(batch.metrics)
    assert batch.prompt_ids == [0, 2, 4, 6]
    # rounds ask for 4, then the 2 still missing, then 1: prompts 0..6, none skipped
    assert m["rollout/sampled_groups"] == 7 and m["rollout/accept_rate"] == 4 / 7


def test_dynamic_bs_trains_on_one_round():
    batch = collect_groups(_loader(), FakeWorkflow(), None, batch_size=4, accept=has_reward_variance,
                           dynamic_bs=True, max_rounds=8)
    assert batch.prompt_ids == [0, 2] and floats(batch.metrics)["rollout/sampled_groups"] == 4


def test_dynamic_bs_with_nothing_accepted_returns_empty():
    batch = collect_groups(_loader(), FakeWorkflow(), None, batch_size=4, accept=lambda g: False,
                           dynamic_bs=True, max_rounds=2)
    m = floats(batch.metrics)
    assert batch.groups == [] and m["rollout/sampled_groups"] == 8 and m["reward/sampled"] == 0.75


def test_a_workflow_returning_malformed_groups_is_named():
    class Broken:
        def rollout(self, samples, gconfig):
            return [{"rewards": torch.ones(2)} for _ in samples]

    with pytest.raises(UserError, match=r"rollout.workflow .*Broken: a trajectory group lacks input_ids"):
        collect_groups(_loader(), Broken(), None, batch_size=4, accept=None, dynamic_bs=False, max_rounds=1)

    class Short:
        def rollout(self, samples, gconfig):
            return [make_group([1.0, 0.0])]

    with pytest.raises(UserError, match=r"returned 1 groups for 4 prompts"):
        collect_groups(_loader(), Short(), None, batch_size=4, accept=None, dynamic_bs=False, max_rounds=1)


class TextRollout:
    """Returns each prompt instead of its trajectory group."""

    def rollout(self, samples, gconfig):
        return [str(s) for s in samples]


class ListRewards:
    """Groups (dicts of their tensors) whose rewards are a Python list, not a tensor."""

    def rollout(self, samples, gconfig):
        out = []
        for _ in samples:
            g = dict(make_group([1.0, 0.0]).tensors)
            g["rewards"] = [1.0, 0.0]
            out.append(g)
        return out


@pytest.mark.parametrize("workflow,message", [
    (TextRollout(), r"rollout.workflow tests.train.test_collect.TextRollout: rollout\(\) returned a list of str; "),
    (ListRewards(), r"rollout.workflow tests.train.test_collect.ListRewards: rewards must be torch tensors; got list"),
])
def test_a_workflow_returning_the_wrong_type_is_a_plugin_output_error(workflow, message):
    # Training and held-out evaluation check the workflow's output the same way.
    with pytest.raises(PluginOutputError, match=message):
        collect_groups(_loader(), workflow, None, batch_size=4, accept=None, dynamic_bs=False, max_rounds=1)
    with pytest.raises(PluginOutputError, match=message):
        evaluate(workflow, list(range(4)), None, 2)


def test_unsatisfiable_filter_fails_clearly():
    with pytest.raises(UserError, match="max_sampling_rounds=3"):
        collect_groups(_loader(), FakeWorkflow(), None, batch_size=4, accept=lambda g: False, dynamic_bs=False,
                       max_rounds=3)
