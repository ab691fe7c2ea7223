"""Over-long prompts never reach the model: a prompt with no room for an answer within the row limit
(``gconfig.max_tokens`` or the model's positions, the smaller) is dropped when the data is built, with a
warning (or stops the run with ``train_dataset.overlong_prompts=error``), and every kept row's answer is
capped so that prompt + answer stay within the limit.

Lengths with the built-in tokenizer (``tests/data/test_overlong_prompts.py``): the chat template adds 8
tokens to a user message; ``QUESTION`` is 18 tokens and ``SENTENCE`` 5, so the rows below render to
1808 (``QUESTION`` 100 times), ``8 + 5k`` (``SENTENCE`` k times) and 26 tokens.
"""

import json

from .helpers import cli

QUESTION = "Tom has 3 apples. Tom buys 4 more. How many apples does Tom have now?"
OTHER = "Anna has 5 pens. Anna buys 2 more. How many pens does Anna have now?"
SENTENCE = "Tom has 3 apples."
LONG = " ".join([QUESTION] * 100)  # 1808 tokens


def run(tmp_path, middle: str, *args: str, check: bool = True):
    """One step on 4 rows in file order (the long prompt first, then ``middle`` and two short ones): the
    step's 2 prompts are the first two kept."""
    data = tmp_path / "data.jsonl"
    rows = [LONG, middle, QUESTION, OTHER]
    data.write_text("".join(json.dumps({"prompt": p, "answer": "#### 7"}) + "\n" for p in rows))
    proc = cli(["--config-name", "grpo", "+scale=tiny", "total_train_steps=1", "sft_warmup.steps=0",
                "valid_dataset=null", f"train_dataset.path={data}", "allow_builtin_model_on_any_data=true",
                "train_dataset.shuffle=false", "actor.path=builtin:tiny", "trial_name=t", *args], cwd=tmp_path,
               check=check)
    return proc, tmp_path / "outputs" / "grpo" / "t"


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_rows(run_dir, middle: str, limit: int, middle_tokens: int) -> None:
    samples = records(run_dir / "samples.jsonl")
    assert samples and all(r["prompt"].count("Tom buys") <= 1 for r in samples)  # the long prompt never ran
    answers = [r["answer_len"] for r in samples if middle in r["prompt"]]
    assert answers and max(answers) <= limit - middle_tokens  # capped: prompt + answer within the limit
    lengths = [r["rollout/seq_len"] for r in records(run_dir / "metrics.jsonl") if "rollout/seq_len" in r]
    assert lengths and max(lengths) <= limit


def test_max_tokens_drops_the_long_prompt_and_caps_the_answers(tmp_path):
    middle = " ".join([SENTENCE] * 10)  # 58 tokens: 6 left for its answer (max_new_tokens is 8)
    proc, run_dir = run(tmp_path, middle, "gconfig.max_tokens=64")
    assert ("train_dataset: dropped 1 of 4 prompts with no room for an answer: e.g. line 1 of 'data.jsonl' has 1808 "
            "prompt tokens (rendered by the chat template) and the row limit is 64 tokens of prompt plus answer "
            "(gconfig.max_tokens=64)") in proc.stderr
    check_rows(run_dir, middle, 64, 58)


def test_overlong_prompts_error_stops_with_one_line(tmp_path):
    proc, run_dir = run(tmp_path, QUESTION, "gconfig.max_tokens=64", "train_dataset.overlong_prompts=error",
                        check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert errors[0].startswith("Error: train_dataset: line 1 of 'data.jsonl' has 1808 prompt tokens")
    assert "gconfig.max_tokens=64" in errors[0] and "train_dataset.overlong_prompts=drop" in errors[0]
    assert not (run_dir / "metrics.jsonl").exists()


def test_the_models_positions_bind_when_max_tokens_is_larger(tmp_path):
    middle = " ".join([SENTENCE] * 100)  # 508 tokens: 4 left of the built-in model's 512 positions
    proc, run_dir = run(tmp_path, middle)  # gconfig.max_tokens is 32768
    assert ("dropped 1 of 4 prompts with no room for an answer: e.g. line 1 of 'data.jsonl' has 1808 prompt tokens "
            "(rendered by the chat template) and the row limit is 512 tokens of prompt plus answer "
            "(max_position_embeddings=512 of actor.path='builtin:tiny')") in proc.stderr
    check_rows(run_dir, middle, 512, 508)
