"""Prompts with no room for an answer within the row limit (``gconfig.max_tokens`` or the model's
positions, the smaller) are dropped when the dataset is built, or are an error; counted as the engine
sees them (rendered by the chat template).

Hand-derived lengths with the built-in tokenizer (one token per word, number and punctuation mark):
the chat template adds 8 tokens around a user message (``<|im_start|> user \\n`` before it,
``<|im_end|> \\n <|im_start|> assistant \\n`` after it), and ``"Tom has 3 apples."`` is 5 tokens
(``Tom ▁has ▁3 ▁apples .``), so a prompt of that sentence ``k`` times is ``8 + 5k`` tokens.
"""

from __future__ import annotations

import json
import warnings

import pytest
from transformers import GPT2Config, LlamaConfig

from areal_trainer.config.data import DatasetConfig
from areal_trainer.config.sampling import GenerationHyperparameters
from areal_trainer.data.datasets import build_samples
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.model.chat import prompt_ids, prompt_lengths
from areal_trainer.model.load import load_positions
from areal_trainer.rollout.limits import Positions, RowLimit, model_positions

SENTENCE = "Tom has 3 apples."


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def data(tmp_path, reps: list[int]) -> str:
    """A jsonl file whose line ``i + 1`` is the sentence ``reps[i]`` times (``8 + 5 * reps[i]`` tokens)."""
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"prompt": " ".join([SENTENCE] * k), "answer": "#### 3"}) + "\n" for k in reps))
    return str(path)


def limit(tokens: int) -> RowLimit:
    return RowLimit(tokens, f"gconfig.max_tokens={tokens}", "raise gconfig.max_tokens")


def build(path, tok, lim, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = build_samples(DatasetConfig(path=path, **kw), tok, "train_dataset", lim)
    return samples, [str(w.message) for w in caught]


def test_the_hand_derived_lengths(tok):
    convs = [[{"role": "user", "content": " ".join([SENTENCE] * k)}] for k in (1, 2, 3)]
    assert prompt_lengths(tok, convs) == [13, 18, 23] == [len(prompt_ids(tok, c)) for c in convs]


def test_a_prompt_needs_room_for_one_answer_token(tok, tmp_path):
    path = data(tmp_path, [1, 2, 3, 1])  # 13, 18, 23, 13 tokens
    samples, warned = build(path, tok, limit(19))  # 18 + 1 fits; 23 + 1 does not
    assert [s["row"] for s in samples] == [f"line {i} of 'data.jsonl'" for i in (1, 2, 4)]
    assert warned == ["train_dataset: dropped 1 of 4 prompts with no room for an answer: e.g. line 3 of 'data.jsonl' "
                      "has 23 prompt tokens (rendered by the chat template) and the row limit is 19 tokens of prompt "
                      "plus answer (gconfig.max_tokens=19). Set train_dataset.overlong_prompts=error to stop instead."]
    samples, warned = build(path, tok, limit(18))  # now 18 + 1 does not fit either
    assert ([s["row"] for s in samples] == [f"line {i} of 'data.jsonl'" for i in (1, 4)]
            and "dropped 2 of 4" in warned[0])
    assert "e.g. line 2 of" in warned[0]  # the first one is the example


def test_nothing_changes_when_every_prompt_fits(tok, tmp_path):
    path = data(tmp_path, [1, 2, 3])
    samples, warned = build(path, tok, limit(24))
    assert samples == build_samples(DatasetConfig(path=path), tok, "train_dataset") and warned == []


def test_error_names_the_first_row_and_counts_the_others(tok, tmp_path):
    path = data(tmp_path, [1, 3, 4])  # 13, 23, 28 tokens
    with pytest.raises(UserError) as e:
        build(path, tok, limit(20), overlong_prompts="error")
    assert str(e.value) == (
        "train_dataset: line 2 of 'data.jsonl' has 23 prompt tokens (rendered by the chat template) and the row limit "
        "is 20 tokens of prompt plus answer (gconfig.max_tokens=20), so no answer fits. (1 more of the 3 prompts are "
        "too long too.) Shorten or remove such prompts, raise gconfig.max_tokens, or set "
        "train_dataset.overlong_prompts=drop to leave them out.")
    assert "\n" not in str(e.value)


def test_chat_prompts_count_as_rendered(tok, tmp_path):
    path = tmp_path / "chat.jsonl"
    conv = [{"role": "system", "content": SENTENCE}, {"role": "user", "content": SENTENCE}]  # 2 * (5 + 5) + 3 = 23
    path.write_text(json.dumps({"messages": conv}) + "\n" + json.dumps({"messages": conv[1:]}) + "\n")
    assert len(prompt_ids(tok, conv)) == 23
    samples, warned = build(str(path), tok, limit(23))
    assert [s["row"] for s in samples] == ["line 2 of 'chat.jsonl'"] and "has 23 prompt tokens" in warned[0]


def test_all_dropped_is_an_error(tok, tmp_path):
    with pytest.raises(UserError, match="no usable rows"):
        build(data(tmp_path, [3]), tok, limit(10))


def test_the_limit_is_the_smaller_of_max_tokens_and_the_positions():
    g = GenerationHyperparameters(max_tokens=64)
    model = Positions(512, "max_position_embeddings=512 of actor.path='builtin:tiny'")
    assert RowLimit.of(g, "gconfig", model) == RowLimit(64, "gconfig.max_tokens=64", "raise gconfig.max_tokens")
    assert RowLimit.of(g, "eval_gconfig", None).source == "eval_gconfig.max_tokens=64"
    small = Positions(32, "n_positions=32 of actor.path='x'")
    assert RowLimit.of(g, "gconfig", small) == RowLimit(32, small.source, "use a model with more positions")
    assert RowLimit.of(GenerationHyperparameters(max_tokens=32), "gconfig", small).source == "gconfig.max_tokens=32"


def test_positions_from_the_config_else_a_real_tokenizer_length(tok):
    assert model_positions(LlamaConfig(max_position_embeddings=128), where="m") == Positions(
        128, "max_position_embeddings=128 of m")
    assert model_positions(GPT2Config(n_positions=64)).count == 64  # GPT-2 names it n_positions
    assert model_positions(None, tok) is None  # the built-in tokenizer's model_max_length is "unknown" (1e30)
    tok2 = build_tokenizer()
    tok2.model_max_length = 2048
    assert model_positions(None, tok2) == Positions(2048, "the tokenizer's model_max_length=2048 of the model")


def test_load_positions_reads_the_config_alone(tok, tmp_path):
    assert load_positions("builtin:tiny", tokenizer=tok) == Positions(
        512, "max_position_embeddings=512 of actor.path='builtin:tiny'")
    LlamaConfig(max_position_embeddings=96).save_pretrained(tmp_path)  # a config.json and no weights at all
    assert load_positions(str(tmp_path), tokenizer=tok, key="actor.path").count == 96
    with pytest.raises(UserError, match="actor.path"):
        load_positions("builtin:huge", tokenizer=tok)


def test_the_key_is_checked_and_valid_dataset_inherits_it():
    assert DatasetConfig(overlong_prompts="error").check("train_dataset") == []
    [problem] = DatasetConfig(overlong_prompts="dorp").check("valid_dataset")
    assert problem.startswith("valid_dataset.overlong_prompts: got 'dorp'; must be one of null, 'drop', 'error'.")
    train = DatasetConfig(overlong_prompts="error")
    assert DatasetConfig().inheriting(train).overlong_prompts == "error"
    assert DatasetConfig(overlong_prompts="drop").inheriting(train).overlong_prompts == "drop"
