"""Built-in task, dataset loading (local jsonl/parquet with GSM8K fields), and the prompt loader."""

import json

import pytest

from areal_trainer.config.schema import DatasetConfig
from areal_trainer.data import arith
from areal_trainer.data.datasets import BOXED_SUFFIX, build_samples
from areal_trainer.data.loader import PromptLoader
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.reward.math import gsm8k_reward_fn


def test_arith_is_deterministic_gsm8k_shaped_and_split_disjoint():
    train, test = arith.generate("train", 2000), arith.generate("test", 200)
    assert train == arith.generate("train", 2000)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    for r in train[:50]:
        assert r["answer"].split("\n")[-1].startswith("#### ")
        assert gsm8k_reward_fn(r["question"], r["answer"], r["answer"]) == 1.0


def test_builtin_tokenizer_round_trips_every_problem():
    tok = build_tokenizer()
    for r in arith.generate("test", 100):
        text = r["question"] + "\n" + r["answer"]
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_local_file_with_gsm8k_fields(tmp_path, ext):
    import datasets

    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(5)]
    rows.append({"question": "x " * 50, "answer": "#### 1"})
    path = tmp_path / f"d.{ext}"
    (datasets.Dataset.from_list(rows).to_json(path) if ext == "jsonl"
     else datasets.Dataset.from_list(rows).to_parquet(path))
    cfg = DatasetConfig(path=str(path), max_length=20)
    samples = build_samples(cfg, build_tokenizer(), "train_dataset")
    assert len(samples) == 5  # the long question is dropped by max_length
    assert samples[0]["messages"][0]["content"] == rows[0]["question"] + BOXED_SUFFIX


def test_row_without_answer_names_row_and_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "a", "answer": "#### 1"}) + "\n" + json.dumps({"question": "b"}) + "\n")
    with pytest.raises(UserError, match=r"line 2 of 'd.jsonl': no 'answer' value \(or an empty one\)\. Columns in that "
                                        r"row: 'question'\. Set train_dataset.answer_key"):
        build_samples(DatasetConfig(path=str(path)), build_tokenizer(), "train_dataset")


def test_loader_resumes_exactly():
    samples = list(range(23))
    a = PromptLoader(samples, 5, shuffle=True, drop_last=True, seed=3)
    seq = [a.next_batch() for _ in range(7)]
    b = PromptLoader(samples, 5, shuffle=True, drop_last=True, seed=3)
    for _ in range(3):
        b.next_batch()
    c = PromptLoader(samples, 5, shuffle=True, drop_last=True, seed=3)
    c.load_state_dict(b.state_dict())
    assert [c.next_batch() for _ in range(4)] == seq[3:]
    assert a.steps_per_epoch == 4 and sorted(sum(seq[:4], [])) != sorted(sum(seq[4:7], []))


def test_loader_splits_ranks_disjointly():
    samples = list(range(16))
    parts = [PromptLoader(samples, 8, shuffle=True, drop_last=True, seed=0, rank=r, world_size=2).next_batch()
             for r in range(2)]
    assert len(parts[0]) == 4 and not set(parts[0]) & set(parts[1])
