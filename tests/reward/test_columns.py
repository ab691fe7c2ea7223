"""The reward functions' columns: checked against each dataset's columns at start-up (every function's
problem at once, naming the function, the missing names, the columns the rows have and the fix), and the
answer column reaching rewards under both names (``answer`` and its own) with ``answer_key``."""

import json

import pytest

from areal_trainer.components import load_config
from areal_trainer.components.reward import bind_reward
from areal_trainer.config.schema import DatasetConfig
from areal_trainer.data import arith
from areal_trainer.data.datasets import build_samples, field_names
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.reward.functions import RewardFunction
from areal_trainer.reward.service import sample_of

P = "tests.plugins."


def _spec(*fns, kwargs="{}"):
    cfg = load_config("grpo", [f"reward.fn=[{','.join(P + f for f in fns)}]", f"reward.kwargs={kwargs}"])
    problems = []
    spec = bind_reward(cfg.reward, problems)
    assert problems == []
    return spec


def test_every_function_missing_a_column_is_named_for_every_dataset_at_once():
    spec = _spec("tolerant", "accuracy", "close_enough", "takes_solution")
    problems = spec.column_problems({"train_dataset": {"task"}, "valid_dataset": {"solution"}})
    assert problems == [
        "reward.fn[0]: tests.plugins.tolerant(prompt, completion, answer, tolerance) needs 'tolerance', which neither "
        "the rows of train_dataset (columns: task) nor the configured kwargs provide. Add the column, give the "
        "parameter a default, or set it in the kwargs.",
        "reward.fn[1]: tests.plugins.accuracy(completions, solution, **kwargs) needs 'solution', which neither the "
        "rows of train_dataset (columns: task) nor the configured kwargs provide. Add the column, give the parameter "
        "a default, or set it in the kwargs.",
        "reward.fn[3]: tests.plugins.takes_solution(prompt, completion, answer, solution, scale=1.0) needs "
        "'solution', which neither the rows of train_dataset (columns: task) nor the configured kwargs provide. Add "
        "the column, give the parameter a default, or set it in the kwargs.",
        "reward.fn[0]: tests.plugins.tolerant(prompt, completion, answer, tolerance) needs 'tolerance', which neither "
        "the rows of valid_dataset (columns: solution) nor the configured kwargs provide. Add the column, give the "
        "parameter a default, or set it in the kwargs.",
    ]


def test_columns_a_function_gets_from_the_kwargs_or_the_call_are_not_required():
    spec = _spec("tolerant", kwargs="{tolerance: 0.5}")
    assert spec.column_problems({"train_dataset": set()}) == []
    assert _spec("solution_only", "exact").column_problems({"train_dataset": {"solution"}}) == []
    assert _spec("accuracy").column_problems({}) == []  # no dataset scored (an agent run): nothing to check


def test_a_column_only_some_rows_lack_is_still_reported_when_they_are_scored():
    fn = RewardFunction.bind(P + "takes_solution", kwargs={}, key="reward.fn")
    assert fn.column_problem(frozenset({"solution"})) is None  # some row has it: start-up lets it pass
    with pytest.raises(UserError, match=r"needs 'solution', which neither the dataset rows \(columns: id\)"):
        fn.sample_call(sample_of({"prompt": "p", "answer": None, "fields": {"id": 1}}, "c"))


@pytest.fixture
def solution_rows(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": r["question"]}], "solution": r["answer"].split("#### ")[1],
             "task": "arith"} for r in arith.generate("train", 2)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return build_samples(DatasetConfig(path=str(path), answer_key="solution"), build_tokenizer(), "train_dataset")


def test_answer_key_solution_gives_a_trl_reward_both_answer_and_solution(solution_rows):
    fn = RewardFunction.bind(P + "trl_accuracy", kwargs={}, key="reward.fn")
    assert fn.column_problem(field_names(solution_rows)) is None
    samples = [sample_of(s, s["answer"]) for s in solution_rows]  # conversational rows: a chat completion
    _, kwargs = fn.batch_call(samples)
    assert kwargs["solution"] == kwargs["answer"] == [s["answer"] for s in solution_rows]
    assert kwargs["task"] == ["arith", "arith"] and fn.fn(**kwargs) == [1.0, 1.0]


def test_answer_key_solution_keeps_per_sample_functions_working(solution_rows):
    s = solution_rows[0]
    sample = sample_of(s, "7")
    echo = RewardFunction.bind(P + "echo_kwargs", kwargs={}, key="reward.fn")
    args, kwargs = echo.sample_call(sample)
    assert args == (s["prompt"], [{"role": "assistant", "content": "7"}], s["answer"])
    assert kwargs == {"solution": s["answer"], "task": "arith"}  # fn(prompt, completion, answer, **fields)
    positional = RewardFunction.bind(P + "solution_positional", kwargs={}, key="reward.fn")
    args, kwargs = positional.sample_call(sample)  # its third parameter is named solution: filled once, by position
    assert args[2] == s["answer"] and kwargs == {}
    takes = RewardFunction.bind(P + "takes_solution", kwargs={}, key="reward.fn")
    assert takes.sample_call(sample)[1] == {"solution": s["answer"]}


def test_the_config_and_the_functions_know_the_same_styles():
    """``reward.style`` is checked by the config (which may not import the reward layer) and implemented by
    ``reward/functions.py``: the two tuples stay one list."""
    from areal_trainer.config.reward import STYLES as CONFIG_STYLES
    from areal_trainer.reward.functions import STYLES

    assert CONFIG_STYLES == STYLES
