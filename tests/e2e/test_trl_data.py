"""TRL-style data on the built-in model through the real command line: a conversational ``prompt`` and a
``solution`` column, scored by a TRL-style batched reward. Without an answer the warm start is skipped
with a notice; ``answer_key=solution`` still passes ``solution``; a reward that needs a column no row has
fails before any model loads; a ``total_train_steps`` the epochs cut short and the words the built-in
tokenizer cannot spell are each said once at start-up."""

import json

from areal_trainer.data import arith

from .helpers import cli

BASE = ["--config-name", "grpo", "+scale=tiny", "allow_builtin_model_on_any_data=true", "valid_dataset=null",
        "train_dataset.max_rows=4", "reward.fn=tests.plugins.trl_accuracy"]
SYSTEM = "Answer briefly, please."
"""Words the built-in vocabulary lacks, in every prompt."""


def _data(tmp_path) -> str:
    rows = [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}],
             "solution": r["answer"].split("#### ")[1]} for r in arith.generate("train", 4)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _steps(tmp_path, trial: str) -> list[int]:
    with open(tmp_path / "outputs" / "grpo" / trial / "metrics.jsonl") as f:
        return [r["step"] for r in map(json.loads, f) if "time/step" in r]


def _calls(record) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_prompt_only_trl_data_skips_the_warm_start_and_says_what_the_run_cannot_do(tmp_path):
    data, record = _data(tmp_path), tmp_path / "calls.jsonl"
    proc = cli([*BASE, "trial_name=a", f"train_dataset.path={data}", "sft_warmup.steps=null", "total_train_steps=3"],
               cwd=tmp_path, env={"AREAL_TEST_RECORD": str(record)})
    out = proc.stdout
    assert out.count("notice: SFT warm start skipped: no row of train_dataset has something to imitate") == 1
    assert "or set sft_warmup.steps=0 to skip the warm start without this notice." in out
    assert "notice: total_train_steps=3 is more than total_train_epochs=1 allows: 2 steps per epoch (4 prompts, 2 " \
           "per step) x 1 epoch, so the run stops at step 2. Set total_train_epochs=2 to run all 3 steps." in out
    (warning,) = [line for line in proc.stderr.splitlines() if line.startswith("warning: the tokenizer of")]
    assert warning.startswith("warning: the tokenizer of actor.path='builtin:tiny' cannot spell words of 4 of the 4 "
                              "prompts of train_dataset")
    assert ("'Answer'" in warning and "'please'" in warning
            and "actor.path=HuggingFaceTB/SmolLM2-135M-Instruct" in warning)
    assert "sft/loss" not in (tmp_path / "outputs" / "grpo" / "a" / "metrics.jsonl").read_text()
    assert _steps(tmp_path, "a") == [1, 2]
    calls = _calls(record)
    solutions = {json.loads(line)["solution"] for line in open(data)}
    assert {s for c in calls for s in c["solution"]} == solutions and all(c["answer"] is None for c in calls)


def test_answer_key_solution_warms_up_on_the_solutions_and_still_passes_solution(tmp_path):
    data, record = _data(tmp_path), tmp_path / "calls.jsonl"
    proc = cli([*BASE, "trial_name=b", f"train_dataset.path={data}", "train_dataset.answer_key=solution",
                "total_train_steps=1"], cwd=tmp_path, env={"AREAL_TEST_RECORD": str(record)})
    # Every row has its answer: no notice (a warm start that an earlier run of the same settings left in the
    # cache is reused, and says so).
    assert "notice: SFT warm start" not in proc.stdout
    assert '"sft/loss"' in (tmp_path / "outputs" / "grpo" / "b" / "metrics.jsonl").read_text()
    calls = _calls(record)
    assert calls and all(c["solution"] == c["answer"] and None not in c["solution"] for c in calls)


def test_a_reward_that_needs_a_column_no_row_has_fails_before_any_model_loads(tmp_path):
    proc = cli([*BASE, "trial_name=c", f"train_dataset.path={_data(tmp_path)}", "reward.fn=tests.plugins.tolerant"],
               cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "Error: 2 configuration problems:" in proc.stderr
    assert "  - reward.fn: tests.plugins.tolerant(prompt, completion, answer, tolerance) needs 'tolerance', which " \
           "neither the rows of train_dataset (columns: solution) nor the configured kwargs provide. Add the column, " \
           "give the parameter a default, or set it in the kwargs." in proc.stderr
    assert "  - sft_warmup.steps=2: no row of train_dataset" in proc.stderr  # +scale=tiny asks for 2 steps
    assert "SFT warm start" not in proc.stdout + proc.stderr and "notice:" not in proc.stdout
    assert not (tmp_path / "outputs" / "grpo" / "c").exists()
