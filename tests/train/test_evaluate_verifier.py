"""Held-out accuracy only from a verifier: which source is one (``components/verifier.py``), and the
accuracy computed from its own values (``train/evaluate.py``), with numbers worked out by hand."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from areal_trainer.components.reward import RewardSpec
from areal_trainer.components.verifier import bind_verifier
from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.failures import FailurePolicy
from areal_trainer.reward import is_correct, verdict_of
from areal_trainer.reward.code import unit_tests
from areal_trainer.reward.functions import RewardFunction
from areal_trainer.reward.math import gsm8k_reward_fn
from areal_trainer.reward.service import FunctionReward, RewardService
from areal_trainer.rollout.agents.multi_turn import MultiTurnWorkflow
from areal_trainer.rollout.workflows.single_turn import RLVRWorkflow
from areal_trainer.train.evaluate import UNREAD, accuracy, evaluate, finish, undiscounted_episode_rewards
from tests.groups import make_group, reward_service
from tests.rollout.test_multiturn import RIGHT, SAMPLE, WRONG, ScriptedEngine

GSM8K, CODE = "areal_trainer.reward.math.gsm8k_reward_fn", "areal_trainer.reward.code.unit_tests"
LENGTH = "tests.plugins.length_or_none"  # batched: the completion's length (a format-like score)


def _fn(path: str) -> RewardFunction:
    return RewardFunction.bind(path, kwargs={}, key="reward.fn")


def _reward(*paths: str, weights=None, model: bool = False, remote: bool = False) -> RewardSpec:
    return RewardSpec(tuple(_fn(p) for p in paths), weights, workers=0,
                      failures=FailurePolicy.of(reward_timeout=5.0, reward_workers=0),
                      model={"path": "/models/rm", "dtype": "auto", "micro_batch_size": 8} if model else None,
                      remote={"url": "http://127.0.0.1:1/score"} if remote else None)


def _cfg(verifier=None, agent=None, valid=True):
    return SimpleNamespace(evaluator=SimpleNamespace(verifier=verifier), rollout=SimpleNamespace(agent=agent),
                           valid_dataset=object() if valid else None)


def _bind(reward: RewardSpec, **cfg):
    problems: list[str] = []
    spec = bind_verifier(_cfg(**cfg), reward, problems)
    return spec, problems


# -- which source is a verifier -------------------------------------------------------------------
def test_the_built_in_checks_declare_their_verdicts():
    assert verdict_of(gsm8k_reward_fn) == "binary" and verdict_of(unit_tests) == "all_or_nothing"
    assert verdict_of(lambda *a: 1.0) is None


def test_a_built_in_verifier_is_chosen_also_inside_a_weighted_mix():
    spec, problems = _bind(_reward(GSM8K, LENGTH, weights=(1.0, 0.01)))
    assert problems == [] and spec.source == "gsm8k_reward_fn" and spec.verdict == "binary"
    assert not spec.binary_only and not spec.rewards_are_values  # its own values, not the weighted sum
    assert spec.what == "weighted sum of gsm8k_reward_fn, length_or_none"


def test_the_code_reward_is_all_or_nothing():
    spec, _ = _bind(_reward(CODE))
    assert spec.source == "unit_tests" and spec.verdict == "all_or_nothing" and spec.rewards_are_values


def test_a_lone_user_function_is_a_verifier_only_if_its_values_are_0_or_1():
    spec, _ = _bind(_reward(LENGTH))
    assert spec.source == "length_or_none" and spec.binary_only
    assert spec.note == (f"no verifier: {LENGTH} gave values other than 0 and 1 on the held-out set; "
                         f"evaluator.verifier={LENGTH} reports accuracy (correct when positive)")


def test_a_named_user_function_is_a_verifier_without_the_0_or_1_rule():
    for name in (LENGTH, "length_or_none"):
        spec, problems = _bind(_reward(GSM8K, LENGTH, weights=(1.0, 0.01)), verifier=name)
        assert problems == [] and spec.source == "length_or_none" and not spec.binary_only


@pytest.mark.parametrize("reward,what,kind", [
    (_reward(model=True), "reward model", "a reward model"),
    (_reward(remote=True), "scoring service", "a scoring service"),
])
def test_a_reward_model_or_a_scoring_service_alone_is_never_a_verifier(reward, what, kind):
    spec, problems = _bind(reward)
    assert problems == [] and not spec.active and spec.what == what
    assert spec.note == (f"no verifier: {kind} scores how good an answer is, not whether it is right; add a "
                         "checking function to reward.fn and name it in evaluator.verifier to report accuracy")


def test_a_mix_without_a_verifier_has_none_and_says_how_to_name_one():
    spec, _ = _bind(_reward(LENGTH, model=True))
    assert not spec.active and spec.what == "weighted sum of length_or_none, reward model"
    assert spec.note == ("no verifier among the reward sources; evaluator.verifier=<one of "
                         "tests.plugins.length_or_none> reports accuracy from that function's own values")


def test_none_turns_accuracy_off():
    spec, _ = _bind(_reward(GSM8K), verifier="none")
    assert not spec.active and spec.note == "no accuracy: evaluator.verifier=none"


def test_an_agent_run_judges_its_episodes():
    spec, problems = _bind(_reward(GSM8K), agent="examples.agents.try_again.agent.run")
    assert problems == [] and spec.episodes and spec.binary_only and spec.what == "agent episodes"


@pytest.mark.parametrize("cfg,reward,message", [
    (dict(verifier="nope"), _reward(GSM8K),
     f"evaluator.verifier: got 'nope', which is none of reward.fn's functions ({GSM8K}); give one of them by import "
     "path or name, none (no accuracy), or null (auto)."),
    (dict(verifier="reward_model"), _reward(GSM8K, model=True),
     "evaluator.verifier: got 'reward_model', a reward model or scoring service; its score says how good an answer "
     f"is, not whether it is right, so it is never a verifier. Name a function of reward.fn ({GSM8K}) or set none."),
    (dict(verifier=GSM8K, agent="my.agent"), _reward(GSM8K),
     f"evaluator.verifier: got '{GSM8K}'; an agent run (rollout.agent) is scored by the agent's episode reward, not "
     "by a reward.fn function, so there is nothing to name: leave it null (accuracy when every held-out episode "
     "scores 0 or 1) or set none."),
    (dict(), _reward(GSM8K, CODE),
     f"evaluator.verifier: reward.fn has 2 verifiers ({GSM8K}, {CODE}); set evaluator.verifier to the one whose "
     "verdict is the task's accuracy (or none)."),
])
def test_a_verifier_that_cannot_be_is_a_config_problem(cfg, reward, message):
    spec, problems = _bind(reward, **cfg)
    assert spec is None and problems == [message]


def test_two_built_in_verifiers_without_evaluation_are_no_problem():
    assert _bind(_reward(GSM8K, CODE), valid=False) == (None, [])


def test_the_config_key_is_checked_before_anything_loads():
    from areal_trainer.components import load

    with pytest.raises(ValueError, match="evaluator.verifier: got 'nope', which is none of reward.fn's functions"):
        load("grpo", ["evaluator.verifier=nope"])
    assert load("grpo", ["evaluator.verifier=gsm8k_reward_fn"]).verifier.source == "gsm8k_reward_fn"


# -- the accuracy ---------------------------------------------------------------------------------
def test_is_correct_reads_a_verdict():
    values = torch.tensor([1.0, 0.8, 0.0, math.nan])
    assert is_correct(values, "binary").tolist() == [True, True, False, False]
    assert is_correct(values, "all_or_nothing").tolist() == [True, False, False, False]


def test_a_weighted_mix_counts_the_verifiers_own_values():
    # gsm8k 1, 0 | 0, 1 plus 0.2 of a format score: every reward is positive (the old rule: 100%).
    spec, _ = _bind(_reward(GSM8K, LENGTH, weights=(1.0, 0.2)))
    out = accuracy([torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])], spec, n_samples=2)
    assert out["eval/accuracy"].value == 0.25 and out["eval/accuracy"].weight == 4
    assert out["eval/pass@k"].value == 0.5 and out["eval/pass@k"].weight == 2 and out[UNREAD].value == 0


def test_partial_credit_counts_only_answers_passing_every_test():
    spec, _ = _bind(_reward(CODE))
    out = accuracy([torch.tensor([1.0, 0.2]), torch.tensor([0.0, 0.8])], spec, n_samples=2)
    assert out["eval/accuracy"].value == 0.25  # one of four passes all its tests (a positive reward: three)
    assert out["eval/pass@k"].value == 0.5


def test_auto_accuracy_is_dropped_when_any_value_is_not_0_or_1():
    spec, _ = _bind(_reward(LENGTH))
    binary = finish({k: v.value for k, v in accuracy([torch.tensor([1.0, 0.0, math.nan])], spec, 1).items()})
    assert binary == {"eval/accuracy": pytest.approx(1 / 3)}  # a sample without a value is not correct
    other = finish({k: v.value for k, v in accuracy([torch.tensor([1.0, 0.5])], spec, 1).items()})
    assert other == {}


def test_agent_episodes_are_judged_before_the_turn_discount():
    g = make_group([0.9, 0.0, 1.0])
    g.rows = dataclasses.replace(g.rows, num_turns=torch.tensor([2.0, 1.0, 1.0]))
    g.episode_rows, g.episode_rewards = (1, 1, 1), (0.9, 0.0, 1.0)
    assert undiscounted_episode_rewards(g, 0.9).tolist() == pytest.approx([1.0, 0.0, 1.0])
    # two calls per episode in the individual export: each row is a call
    g2 = make_group([0.81, 0.9, 0.0])
    g2.rows = dataclasses.replace(g2.rows, num_turns=torch.ones(3))
    g2.episode_rows, g2.episode_rewards = (2, 1), (0.81, 0.0)
    assert undiscounted_episode_rewards(g2, 0.9).tolist() == pytest.approx([0.9, 0.0])  # 0.81 / 0.9: not 0 or 1


class _Single:
    """A workflow of one fixed group per prompt that sets no ``source_values`` (a user's own)."""

    def __init__(self, rewards):
        self.rewards = rewards

    def rollout(self, samples, gconfig):
        return [make_group(self.rewards) for _ in samples]


def test_a_workflow_without_source_values_gives_accuracy_only_for_one_unweighted_source():
    gc = GenerationHyperparameters(n_samples=2)
    one, _ = _bind(_reward(GSM8K))
    out = finish({k: v.value for k, v in evaluate(_Single([1.0, 0.0]), [{}], gc, 1, verifier=one).items()})
    assert out["eval/accuracy"] == 0.5 and out["eval/reward"] == 0.5
    mix, _ = _bind(_reward(GSM8K, LENGTH, weights=(1.0, 0.2)))
    out = finish({k: v.value for k, v in evaluate(_Single([1.2, 0.2]), [{}], gc, 1, verifier=mix).items()})
    assert "eval/accuracy" not in out and out["eval/reward"] == pytest.approx(0.7)


def _mix_service():
    sources = [FunctionReward(_fn(p), workers=0) for p in (GSM8K, LENGTH)]
    return RewardService(sources, weights=[1.0, 0.01])


def test_single_turn_evaluation_of_a_weighted_mix():
    from areal_trainer.model.builtin import build_tokenizer

    tok = build_tokenizer()
    spec, _ = _bind(_reward(GSM8K, LENGTH, weights=(1.0, 0.01)))
    wf = RLVRWorkflow(engine=ScriptedEngine(tok, [[RIGHT, WRONG]]), tokenizer=tok, reward=_mix_service())
    examples: list = []
    out = evaluate(wf, [SAMPLE], GenerationHyperparameters(n_samples=2, max_new_tokens=16), 1, examples,
                   verifier=spec)
    out = finish({k: v.value for k, v in out.items()})
    # rewards 1 + 0.01 * 16 and 0 + 0.01 * 16 (both answers are 16 characters): both positive
    assert len(RIGHT) == len(WRONG) == 16
    assert out["eval/reward"] == pytest.approx(0.5 + 0.16) and out["eval/accuracy"] == 0.5
    assert out["eval/pass@k"] == 1.0 and examples[0][1] is True  # the first answer is right


def test_multi_turn_episodes_carry_the_last_answers_values():
    from areal_trainer.model.builtin import build_tokenizer

    tok = build_tokenizer()
    spec, _ = _bind(_reward(GSM8K))
    # episode 1: wrong then right (reward 0.9, right within the turns); episode 2: wrong twice
    engine = ScriptedEngine(tok, [[WRONG, WRONG], [RIGHT, WRONG]])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_service(max_error_fraction=1.0), max_turns=2)
    out = evaluate(wf, [SAMPLE], GenerationHyperparameters(n_samples=2, max_new_tokens=16), 1, verifier=spec)
    out = finish({k: v.value for k, v in out.items()})
    assert out["eval/reward"] == pytest.approx(0.45) and out["eval/accuracy"] == 0.5
