"""TRL-style data on any model, decided from the samples before a model loads: the answer column keeps its
own name, the warm start trains on the rows that have something to imitate (or is skipped, or is a
configuration error), the run's length when the epochs cut ``total_train_steps`` short, and the words the
built-in tokenizer cannot spell."""

import json
from collections import Counter

import pytest

from areal_trainer.components import load_config
from areal_trainer.config.schema import DatasetConfig
from areal_trainer.data import arith
from areal_trainer.data.datasets import build_samples, field_names
from areal_trainer.data.loader import PromptLoader, run_length, steps_per_epoch
from areal_trainer.data.vocab import unknown_words, unknown_words_warning
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.train.sft import DEFAULT_SFT_STEPS, plan_warm_start

TOK = build_tokenizer()


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _trl_rows(n: int, **extra) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": r["question"]}], "solution": r["answer"].split("#### ")[1],
             **extra} for r in arith.generate("train", n)]


def _sample(answer=None, **fields) -> dict:
    return {"messages": [{"role": "user", "content": "q"}], "prompt": "q", "answer": answer, "fields": fields,
            "row": "row 1 of 'd.jsonl'"}


# -- the answer column keeps its name ------------------------------------------------------------------------
def test_answer_key_solution_keeps_solution_as_a_column(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", _trl_rows(2, task="arith"))
    (s, _) = build_samples(DatasetConfig(path=path, answer_key="solution"), TOK, "train_dataset")
    assert s["answer"] == s["fields"]["solution"] and s["fields"] == {"solution": s["answer"], "task": "arith"}
    assert field_names(build_samples(DatasetConfig(path=path), TOK, "train_dataset")) == {"solution", "task"}


def test_a_column_named_answer_is_the_answer_and_not_a_field_too():
    (s,) = build_samples(DatasetConfig(path="builtin:arith", max_rows=1), TOK, "train_dataset")
    assert "####" in s["answer"] and set(s["fields"]) == {"demonstration"}


# -- the warm start's rows ----------------------------------------------------------------------------------
def _cfg(*overrides):
    return load_config("grpo", ["allow_builtin_model_on_any_data=true", "train_dataset.path=d.jsonl", *overrides])


def test_prompt_only_data_skips_the_default_warm_start_with_a_notice():
    plan = plan_warm_start([_sample(), _sample(solution="5")], _cfg())
    assert plan.steps == 0 and plan.samples == [] and plan.problems == ()
    assert plan.notice == (
        "SFT warm start skipped: no row of train_dataset has something to imitate (a reference answer as text, named "
        "by train_dataset.answer_key; a 'demonstration' column; or a 'demonstration_messages' conversation), so the "
        "built-in model starts RL untrained. Add an answer column (train_dataset.answer_key=<column>) or a "
        "'demonstration' column to warm it up, or set sft_warmup.steps=0 to skip the warm start without this notice.")


def test_an_explicit_warm_start_on_data_with_nothing_to_imitate_is_a_configuration_problem():
    plan = plan_warm_start([_sample(), _sample(answer="  ")], _cfg("sft_warmup.steps=5"))
    assert plan.steps == 0 and plan.notice is None
    assert plan.problems == (
        "sft_warmup.steps=5: no row of train_dataset (train_dataset.path='d.jsonl') has something to imitate (a "
        "reference answer as text, named by train_dataset.answer_key; a 'demonstration' column; or a "
        "'demonstration_messages' conversation), so the warm start has nothing to train on. Add an answer column "
        "(train_dataset.answer_key=<column>) or a 'demonstration' column, or set sft_warmup.steps=0 (no warm start).",)


def test_some_rows_with_something_to_imitate_are_the_warm_start_rows():
    conversation = [{"role": "assistant", "content": "5"}]
    rows = [_sample(answer="5"), _sample(), _sample(demonstration="6"), _sample(demonstration_messages=conversation),
            _sample(answer=5)]  # a number is no text to imitate
    plan = plan_warm_start(rows, _cfg())
    assert plan.steps == DEFAULT_SFT_STEPS and plan.samples == [rows[0], rows[2], rows[3]] and plan.problems == ()
    assert plan.notice.startswith("SFT warm start: on the 3 of 5 rows of train_dataset that have something to imitate")
    assert plan.notice.endswith("the other 2 have none.")
    every = plan_warm_start(rows[:1], _cfg())
    assert every.samples == rows[:1] and every.notice is None


def test_no_warm_start_asked_for_decides_nothing():
    assert plan_warm_start([_sample()], _cfg("sft_warmup.steps=0")) == plan_warm_start([_sample()], _cfg(
        "actor.path=HuggingFaceTB/SmolLM2-135M-Instruct", "allow_builtin_model_on_any_data=false")) == \
        plan_warm_start([], _cfg("sft_warmup.steps=0"))


def test_a_malformed_demonstration_conversation_is_a_problem_before_the_model_loads():
    rows = [_sample(answer="1", demonstration_messages=[{"role": "tool", "content": "1"}])] * 3
    (problem,) = plan_warm_start(rows, _cfg()).problems
    assert problem.startswith("sft_warmup: row 1 of 'd.jsonl': 'demonstration_messages' must be a list of chat "
                              "messages (the turns after the prompt) with an assistant turn")
    assert problem.endswith("(2 more of the 3 rows have such problems too.)")


# -- the run's length ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, batch, drop_last, steps", [(289, 16, True, 18), (289, 16, False, 19), (32, 16, True, 2)])
def test_steps_per_epoch_is_the_loaders(n, batch, drop_last, steps):
    assert steps_per_epoch(n, batch, drop_last) == steps
    assert PromptLoader(list(range(n)), batch, shuffle=False, drop_last=drop_last, seed=0).steps_per_epoch == steps


def test_more_steps_than_the_epochs_allow_stop_at_the_epochs_with_a_notice():
    total, notice = run_length(1, 30, 18, 289, 16)
    assert total == 18
    assert notice == ("total_train_steps=30 is more than total_train_epochs=1 allows: 18 steps per epoch (289 prompts, "
                      "16 per step) x 1 epoch, so the run stops at step 18. Set total_train_epochs=2 to run all 30 "
                      "steps.")
    assert run_length(2, 37, 18, 289, 16)[1].endswith("x 2 epochs, so the run stops at step 36. Set "
                                                      "total_train_epochs=3 to run all 37 steps.")


@pytest.mark.parametrize("epochs, steps, total", [(1, None, 18), (1, 18, 18), (1, 5, 5), (3, 40, 40), (3, None, 54)])
def test_the_smaller_length_wins_quietly_when_the_epochs_allow_it(epochs, steps, total):
    assert run_length(epochs, steps, 18, 289, 16) == (total, None)


# -- words the tokenizer cannot spell -----------------------------------------------------------------------
def _messages(*texts) -> dict:
    return {"messages": [{"role": "user", "content": t} for t in texts]}


def test_the_unknown_words_are_counted_by_prompt_and_named_most_frequent_first():
    # The built-in vocabulary has "pens" and "Tom", neither "said" nor "," nor any "ë".
    samples = [_messages("Zoe had 3 pens, said Zoë-Anne.", "How many pens does Zoe have?"),
               _messages("Zoe had 2 pens, said Tom."), _messages("Zoe had 2 pens. How many pens does Zoe have?")]
    found = unknown_words(TOK, samples)
    assert (found.prompts, found.total) == (2, 3)
    assert found.counts == Counter({",": 2, "said": 2, "How": 1, "Zoë": 1, "Anne": 1})  # "How" opens a message
    assert found.most_common(2) == [",", "said"]


def test_the_warning_names_at_most_ten_words_the_prompts_and_the_fix():
    words = [f"w{chr(97 + i)}" * (i + 1) for i in range(12)]  # wa, wbwb, ...: the first in 12 prompts, the last in 1
    samples = [_messages(" ".join(words[:k])) for k in range(12, 0, -1)] + [_messages("Zoe had 2 pens.")]
    warning = unknown_words_warning({"train_dataset": unknown_words(TOK, samples),
                                     "valid_dataset": unknown_words(TOK, samples[-2:])}, "actor.path", "builtin:tiny")
    assert warning.startswith("the tokenizer of actor.path='builtin:tiny' cannot spell words of 12 of the 13 prompts "
                              "of train_dataset and 1 of the 2 prompts of valid_dataset: they reach the model as its "
                              "unknown token, the same for every such word. Unknown words: 'wa', 'wbwb', 'wcwcwc', ")
    assert f"{words[9]!r} (the 10 most frequent of 12)" in warning and words[10] not in warning
    assert warning.endswith("Use a pretrained model with its own tokenizer: actor.path=<model> (e.g. "
                            "actor.path=HuggingFaceTB/SmolLM2-135M-Instruct, or actor.path=smollm2 for the packaged "
                            "offline copy).")
    assert "actor.path=<model> and tokenizer_path=null" in unknown_words_warning(
        {"train_dataset": unknown_words(TOK, samples)}, "tokenizer_path", "builtin:tiny")


@pytest.mark.parametrize("path", ["builtin:tiny", "builtin:tiny-tools"])
def test_the_builtin_task_has_no_unknown_word(path):
    tok = build_tokenizer(path)
    for split in ("train", "test"):
        samples = build_samples(DatasetConfig(path="builtin:arith", split=split, max_rows=2000), tok, "train_dataset")
        assert unknown_words(tok, samples) is None


def test_a_tokenizer_without_an_unknown_token_reports_nothing():
    class NoUnk:
        unk_token_id = None

    assert unknown_words(NoUnk(), [_messages("Zoë")]) is None and unknown_words(TOK, []) is None
