"""The final lines about the held-out evaluation (``train/headline.py``), from hand-made records."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from areal_trainer.train.headline import headline, phase

REWARD_MODEL = SimpleNamespace(what="reward model", note="no verifier: a reward model scores how good an answer is")


def _evals(*points, key="eval/accuracy", reward=True):
    out = []
    for step, value in points:
        r = {"step": step, key: value}
        if reward:
            r.setdefault("eval/reward", value)
        out.append(r)
    return out


def test_accuracy_before_and_after_rl():
    records = [*_evals((0, 0.318)), {"step": 1, "reward/task": 0.5}, *_evals((150, 0.526))]
    lines, numbers = headline(records, None)
    assert lines == ["held-out accuracy: 31.8% at step 0 (before RL) -> 52.6% at step 150 (+20.8 points)"]
    assert numbers == {"accuracy_before": 0.318, "accuracy_after": 0.526}


def test_no_verifier_names_what_the_mean_reward_is():
    lines, numbers = headline(_evals((0, 0.12), (150, 0.56), key="eval/reward"), REWARD_MODEL)
    assert lines == ["held-out mean reward (reward model): 0.120 at step 0 (before RL) -> 0.560 at step 150 "
                     "(+0.440; no verifier: a reward model scores how good an answer is)"]
    assert numbers == {"reward_before": 0.12, "reward_after": 0.56}
    assert "accuracy" not in lines[0].replace("no verifier", "")


def test_an_evaluation_without_accuracy_makes_the_whole_run_report_the_mean_reward():
    # a verifier chosen in auto whose values left 0 and 1 at the last evaluation
    records = _evals((0, 0.25)) + [{"step": 2, "eval/reward": 0.4}]
    lines, _ = headline(records, SimpleNamespace(what="digit_share_reward", note="no verifier: ..."))
    assert lines == ["held-out mean reward (digit_share_reward): 0.250 at step 0 (before RL) -> 0.400 at step 2 "
                     "(+0.150; no verifier: ...)"]


def test_pure_distillation_leads_with_the_reverse_kl_and_never_says_before_rl():
    records = [{"step": 0, "eval/accuracy": 0.3, "eval/reward": 0.3, "eval/distill/reverse_kl": 0.48},
               {"step": 150, "eval/accuracy": 0.5, "eval/reward": 0.5, "eval/distill/reverse_kl": 0.22}]
    lines, numbers = headline(records, None, trains_by="distillation")
    assert lines == ["held-out reverse KL to the teacher: 0.480 at step 0 (before distillation) -> 0.220 at step 150 "
                     "(nats per answer token)",
                     "held-out accuracy: 30.0% at step 0 (before distillation) -> 50.0% at step 150 (+20.0 points)"]
    assert numbers["reverse_kl_before"] == 0.48 and numbers["reverse_kl_after"] == 0.22


def test_rl_with_a_teacher_is_before_training():
    records = [{"step": 0, "eval/accuracy": 0.3, "eval/distill/reverse_kl": 0.5},
               {"step": 4, "eval/accuracy": 0.35, "eval/distill/reverse_kl": 0.4}]
    lines, _ = headline(records, None, trains_by="training")
    assert lines[0] == "held-out accuracy: 30.0% at step 0 (before training) -> 35.0% at step 4 (+5.0 points)"
    assert lines[1].startswith("held-out reverse KL to the teacher: 0.500 at step 0 (before training) -> 0.400")


def test_a_first_evaluation_after_step_0_is_not_called_before_anything():
    lines, _ = headline(_evals((25, 0.4), (50, 0.5)), None)
    assert lines == ["held-out accuracy: 40.0% at step 25 -> 50.0% at step 50 (+10.0 points)"]


def test_no_evaluation_no_line():
    assert headline([{"step": 1, "reward/task": 0.5}], None) == ([], {})


@pytest.mark.parametrize("distill,word", [(None, "RL"), (SimpleNamespace(pure=True), "distillation"),
                                          (SimpleNamespace(pure=False), "training")])
def test_phase(distill, word):
    assert phase(distill) == word
