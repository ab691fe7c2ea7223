"""What the model writes: the sample records of ``samples.jsonl`` (built from hand-made rows and the
built-in tokenizer), their file and wandb table, the console's evaluation example, the config key,
and a real tiny run."""

import json
import re

import pytest
import torch

from areal_trainer.advantage.align import aligned_mask
from areal_trainer.components import load_config
from areal_trainer.config.schema import StatsLoggerConfig
from areal_trainer.rollout.rows import Segment, concat_rows, make_row, stack_rows
from areal_trainer.rollout.types import TrajectoryGroup
from areal_trainer.tracking.logger import StatsLogger
from areal_trainer.tracking.samples import (
    TABLE_COLUMNS,
    eval_example,
    mask_runs,
    pick_rows,
    render,
    row_record,
    step_samples,
)
from tests.e2e.helpers import cli

FIELDS = {"step", "prompt_id", "group", "index", "versions", "prompt", "completion", "segments", "reward", "advantage",
          "answer_len", "num_turns", "truncated"}
Q = "Tom has 2 apples. How many apples does Tom have?"
Q2 = "Tom had 5 books and lost 2 of them. How many books are left?"
A = "1 + 1 = 2\n#### 2"


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def prompt_of(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    return ids(tok, text)


def answer(tokens: list[int], version: int | list[int], turn: int = 0) -> Segment:
    versions = [version] * len(tokens) if isinstance(version, int) else list(version)
    return Segment(tokens, True, [-0.5] * len(tokens), versions, turn)


def group_of(rows: list[dict], rewards: list[float], num_turns: list[float] | None = None) -> TrajectoryGroup:
    tensors = stack_rows(rows)
    tensors["rewards"] = torch.tensor(rewards)
    tensors["is_truncated"] = torch.zeros(len(rewards), dtype=torch.bool)
    if num_turns is not None:
        tensors["num_turns"] = torch.tensor(num_turns)
    return TrajectoryGroup(tensors)


def row_of(group: TrajectoryGroup, i: int) -> dict:
    return {k: v[i] for k, v in group.tensors.items()}


# -- which rows -----------------------------------------------------------------------------------
def test_pick_rows_takes_first_answers_first_then_wraps():
    assert pick_rows([2, 2], 3) == [(0, 0), (1, 0), (0, 1)]
    assert pick_rows([1, 3], 3) == [(0, 0), (1, 0), (1, 1)]
    assert pick_rows([2, 2], 10) == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert pick_rows([2, 2], 0) == [] and pick_rows([], 4) == []


def test_mask_runs_and_render():
    assert mask_runs([0, 0, 1, 1, 0, 1]) == [(0, 2, False), (2, 4, True), (4, 5, False), (5, 6, True)]
    assert mask_runs([]) == []
    assert render([{"text": "a", "trained": True}, {"text": "b", "trained": False}, {"text": "c", "trained": True}]) \
        == "a⟦env: b⟧c"


# -- one row --------------------------------------------------------------------------------------
def test_single_turn_record(tok):
    p, a = prompt_of(tok, Q), ids(tok, A) + [tok.eos_token_id]
    g = group_of([make_row([Segment(p), answer(a, 3)]), make_row([Segment(p), answer(a[:2], 3)])], [1.0, 0.0],
                 num_turns=[1.0, 1.0])
    r = row_record(tok, row_of(g, 0), advantage=0.25)
    assert r["prompt"] == tok.decode(p, skip_special_tokens=False) and r["prompt"].endswith("<|im_start|>assistant\n")
    assert r["completion"] == tok.decode(a, skip_special_tokens=False) and r["completion"].endswith("#### 2<eos>")
    assert r["segments"] == [{"text": r["completion"], "trained": True}]
    assert (r["reward"], r["advantage"], r["answer_len"]) == (1.0, 0.25, len(a))
    assert (r["num_turns"], r["truncated"]) == (1, False)
    assert r["versions"] == [3]
    short = row_record(tok, row_of(g, 1))  # the padded row: padding is not decoded
    assert short["completion"] == tok.decode(a[:2], skip_special_tokens=False) and short["answer_len"] == 2
    assert "<pad>" not in short["completion"]


def test_multi_turn_record_marks_environment_tokens(tok):
    p = prompt_of(tok, Q)
    a0, a1 = ids(tok, "1 + 2 = 3\n#### 3") + [tok.eos_token_id], ids(tok, A) + [tok.eos_token_id]
    env = ids(tok, "<|im_end|>\n<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n")
    # the second answer spans a weight update: its last two tokens come from version 1
    row = make_row([Segment(p), answer(a0, 0, 0), Segment(env), answer(a1, [0] * (len(a1) - 2) + [1, 1], 1)])
    r = row_record(tok, row_of(group_of([row], [0.9], num_turns=[2.0]), 0))
    text = [tok.decode(x, skip_special_tokens=False) for x in (a0, env, a1)]
    assert r["segments"] == [{"text": text[0], "trained": True}, {"text": text[1], "trained": False},
                             {"text": text[2], "trained": True}]
    assert r["completion"] == f"{text[0]}⟦env: {text[1]}⟧{text[2]}"
    assert r["prompt"] == tok.decode(p, skip_special_tokens=False)
    assert (r["answer_len"], r["num_turns"], r["versions"]) == (len(a0) + len(a1), 2, [0, 1])


def test_num_turns_falls_back_to_the_trained_segments(tok):
    row = make_row([Segment([4, 5]), answer([7], 0, 0), Segment([8]), answer([9, 2], 0, 1)])
    g = group_of([row], [0.0])  # no num_turns tensor
    assert row_record(tok, row_of(g, 0))["num_turns"] == 2


# -- a training batch -----------------------------------------------------------------------------
def _batch(tok):
    p0, p1 = prompt_of(tok, Q), prompt_of(tok, Q2)
    a, b = ids(tok, A) + [tok.eos_token_id], ids(tok, "5") + [tok.eos_token_id]
    g0 = group_of([make_row([Segment(p0), answer(a, 0)]), make_row([Segment(p0), answer(b, 0)])], [1.0, 0.0])
    g1 = group_of([make_row([Segment(p1), answer(b, 0)]), make_row([Segment(p1), answer(a, 0)])], [0.0, 1.0])
    data, sizes = concat_rows([g0.rows, g1.rows]).as_dict(), [g0.n_rows, g1.n_rows]
    mask = aligned_mask(data["loss_mask"])  # the advantage's next-token aligned mask
    advantages = torch.arange(mask.numel(), dtype=torch.float32).view(mask.shape) * mask
    return data, sizes, advantages, mask, (a, b)


def test_step_samples_rows_order_and_mean_advantage(tok):
    data, sizes, adv, mask, (a, b) = _batch(tok)
    records = step_samples(tok, data, adv, mask, sizes, 3, prompt_ids=[11, 42])
    assert [(r["prompt_id"], r["group"], r["index"]) for r in records] == [(11, 0, 0), (42, 1, 0), (11, 0, 1)]
    rows = [0, 2, 1]  # batch rows of (group, index)
    for r, row in zip(records, rows):
        m = mask[row].bool()
        assert r["advantage"] == pytest.approx(float(adv[row][m].mean()))
        assert r["reward"] == float(data["rewards"][row])
    assert [r["answer_len"] for r in records] == [len(a), len(b), len(b)]
    assert step_samples(tok, data, adv, mask, sizes, 0) == []


def test_advantage_is_none_when_the_loss_ignores_the_row(tok):
    data, sizes, adv, mask, _ = _batch(tok)
    mask[0] = 0
    first = step_samples(tok, data, adv * mask, mask, sizes, 1)[0]
    assert first["advantage"] is None and first["prompt_id"] is None


def test_step_samples_leave_the_global_rng_alone(tok):
    data, sizes, adv, mask, _ = _batch(tok)
    state = torch.get_rng_state()
    assert step_samples(tok, data, adv, mask, sizes, 4) == step_samples(tok, data, adv, mask, sizes, 4)
    assert torch.equal(state, torch.get_rng_state())


# -- file, wandb table, console -------------------------------------------------------------------
def _cfg():
    from types import SimpleNamespace

    return SimpleNamespace(stats_logger=SimpleNamespace(wandb=SimpleNamespace(mode="disabled")))


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_logger_writes_samples_with_the_step_and_truncates_on_resume(tok, tmp_path):
    data, sizes, adv, mask, _ = _batch(tok)
    records = step_samples(tok, data, adv, mask, sizes, 2, prompt_ids=[11, 42])
    log = StatsLogger(str(tmp_path), _cfg())
    log.log_samples(1, [])
    assert not (tmp_path / "samples.jsonl").exists()  # no records, no file
    for step in (1, 2, 3):
        log.log_samples(step, records)
    log.close()
    lines = _lines(tmp_path / "samples.jsonl")
    assert [r["step"] for r in lines] == [1, 1, 2, 2, 3, 3] and set(lines[0]) == FIELDS
    assert list(lines[0])[0] == "step" and "⟦" not in lines[0]["completion"]
    StatsLogger(str(tmp_path), _cfg(), resume_step=2).close()
    assert [r["step"] for r in _lines(tmp_path / "samples.jsonl")] == [1, 1, 2, 2]
    StatsLogger(str(tmp_path), _cfg()).close()  # a fresh run does not keep an earlier run's samples
    assert not (tmp_path / "samples.jsonl").exists()


def test_wandb_gets_a_table_of_the_samples(tok, tmp_path):
    class Run:
        logged = []

        def log(self, data, step):
            self.logged.append((step, data))

        def finish(self):
            pass

    data, sizes, adv, mask, _ = _batch(tok)
    records = step_samples(tok, data, adv, mask, sizes, 2, prompt_ids=[11, 42])
    log = StatsLogger(str(tmp_path), _cfg())
    log.wandb = Run()
    log.log_samples(5, records)
    (step, logged), = Run.logged
    table = logged["samples"]
    assert step == 5 and list(table.columns) == list(TABLE_COLUMNS)
    assert [row[:4] for row in table.data] == [[5, 11, 0, 0], [5, 42, 1, 0]]
    assert table.data[0][TABLE_COLUMNS.index("versions")] == "0"
    assert table.data[0][TABLE_COLUMNS.index("completion")] == records[0]["completion"]


def test_eval_example_shows_prompt_completion_and_verdict(tok):
    p, a = prompt_of(tok, Q), ids(tok, A) + [tok.eos_token_id]
    g = group_of([make_row([Segment(p), answer(a, 4)])], [1.0], num_turns=[1.0])
    text = eval_example(tok, g, step=7, correct=True)
    assert text.splitlines()[0] == "eval example at step 7: reward 1.000 (correct)"
    assert text.splitlines()[1:] == [
        "  prompt:     <|im_start|>user", f"              {Q}<|im_end|>", "              <|im_start|>assistant",
        "  completion: 1 + 1 = 2", "              #### 2<eos>"]  # continuation lines indented
    g.tensors["rewards"][0] = 0.0
    assert "reward 0.000 (wrong)" in eval_example(tok, g, step=7, correct=False)
    # The verdict is the verifier's, never read from the reward: a run without one shows none.
    g.tensors["rewards"][0] = 0.7
    assert eval_example(tok, g, step=7).splitlines()[0] == "eval example at step 7: reward 0.700"


# -- the config key -------------------------------------------------------------------------------
def test_samples_per_step_must_be_a_non_negative_integer():
    assert load_config("grpo", ["stats_logger.samples_per_step=0"]).stats_logger.samples_per_step == 0
    with pytest.raises(ValueError, match=re.escape("stats_logger.samples_per_step: got -1; must be an integer >= 0")):
        load_config("grpo", ["stats_logger.samples_per_step=-1"])
    assert "samples_per_step: got True" in StatsLoggerConfig(samples_per_step=True).check("stats_logger")[0]


# -- a real run -----------------------------------------------------------------------------------
def test_tiny_run_writes_samples_and_prints_an_eval_example(tmp_path):
    proc = cli(["--config-name", "grpo", "+scale=tiny", "stats_logger.samples_per_step=3", "trial_name=s"],
               cwd=tmp_path)
    lines = _lines(tmp_path / "outputs" / "grpo" / "s" / "samples.jsonl")
    # tiny: 2 steps of 2 prompts x 2 answers; 3 samples: both first answers, then group 0's second
    assert [(r["step"], r["group"], r["index"]) for r in lines] == [(s, g, i) for s in (1, 2)
                                                                    for g, i in ((0, 0), (1, 0), (0, 1))]
    for r in lines:
        assert set(r) == FIELDS and r["versions"] == [r["step"] - 1] and r["num_turns"] == 1
        assert r["prompt"].startswith("<|im_start|>") and r["completion"] == r["segments"][0]["text"]
        assert 1 <= r["answer_len"] <= 8 and isinstance(r["advantage"], float) and isinstance(r["prompt_id"], int)
    assert proc.stdout.count("eval example at step") == 3  # before training and after each step


def test_samples_per_step_zero_writes_no_file(tmp_path):
    cli(["--config-name", "grpo", "+scale=tiny", "total_train_steps=1", "stats_logger.samples_per_step=0",
         "trial_name=z"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "z"
    assert (run / "metrics.jsonl").exists() and not (run / "samples.jsonl").exists()
