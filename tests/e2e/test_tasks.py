"""Bring-your-own-task runs through the real command line: TRL-style prompt-only and conversational
datasets with a TRL-style reward given only by its import path, a reward function that misbehaves
in every way (the run completes, each failure is counted, no worker outlives it), a reward model and
a scoring service, alone and weighted with a function, and a service that fails."""

import json
import math
import socket
import uuid

import pytest

from areal_trainer.data import arith
from tests.servers import serving

from .helpers import cli, processes_left, step_records, tiny_classifier

BASE = ["--config-name", "grpo", "+scale=tiny", "allow_builtin_model_on_any_data=true", "sft_warmup.steps=0",
        "valid_dataset=null"]


def _write(path, rows) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def _arith(n: int) -> list[dict]:
    return arith.generate("train", n)


def _run(tmp_path, *overrides, env=None, trial="t") -> dict[int, dict]:
    cli([*BASE, f"trial_name={trial}", *overrides], cwd=tmp_path, env=env)
    return step_records(tmp_path / "outputs" / "grpo" / trial)


def _solution(row: dict) -> str:
    return row["answer"].split("####")[-1].strip()


@pytest.mark.parametrize("shape", ["text", "conversational"])
def test_trl_prompt_only_dataset_trains_with_a_trl_accuracy_given_by_path_alone(tmp_path, shape):
    rows = []
    for r in _arith(16):
        prompt = r["question"] if shape == "text" else [{"role": "system", "content": "There are 3 apples."},
                                                          {"role": "user", "content": r["question"]}]
        rows.append({"prompt": prompt, "solution": _solution(r), "task_type": "arith"})
    data = _write(tmp_path / "train.jsonl", rows)
    record = tmp_path / "calls.jsonl"
    records = _run(tmp_path, f"train_dataset.path={data}", "reward.fn=tests.plugins.recorded_accuracy",
                   env={"AREAL_TEST_RECORD": str(record)})
    assert sorted(records) == [1, 2] and all("reward/recorded_accuracy" in r for r in records.values())
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    by_prompt = {json.dumps(r["prompt"]): r for r in rows}
    seen = 0
    for call in calls:
        assert call["columns"] == ["task_type"]  # prompts, completions and solution are named parameters
        for prompt, completion, solution in zip(call["prompts"], call["completions"], call["solution"]):
            row = by_prompt[json.dumps(prompt)]  # the row's own prompt, not the rendered chat text
            assert solution == row["solution"]
            if shape == "text":
                assert isinstance(completion, str)
            else:
                assert [m["role"] for m in completion] == ["assistant"] and isinstance(completion[0]["content"], str)
            seen += 1
    assert seen == 2 * 2 * 2  # 2 steps x 2 prompts x 2 answers


def test_a_reward_function_gets_a_column_beyond_the_answer(tmp_path):
    """``tolerance`` decides the reward: 1 only when the row's tolerance admits any number (a huge value)."""
    rows = [dict(r, tolerance=1e9 if i % 2 == 0 else -1.0) for i, r in enumerate(_arith(8))]
    data = _write(tmp_path / "train.jsonl", rows)
    records = _run(tmp_path, f"train_dataset.path={data}", "train_dataset.shuffle=false",
                   "reward.fn=tests.plugins.tolerant", "stats_logger.samples_per_step=4")
    samples = [json.loads(line)
               for line in (tmp_path / "outputs" / "grpo" / "t" / "samples.jsonl").read_text().splitlines()]
    assert samples and {s["reward"] for s in samples} <= {0.0, 1.0}
    for s in samples:
        row = next(r for r in rows if r["question"] in s["prompt"])
        assert s["reward"] == (1.0 if row["tolerance"] > 0 else 0.0)
    assert all(r["reward/tolerant"] == 0.5 for r in records.values())


def test_a_reward_that_hangs_raises_returns_nan_or_none_or_exits_costs_nothing_but_its_samples(tmp_path):
    modes = ["ok", "hang", "raise", "nan", "none", "exit"]
    rows = [dict(r, mode=modes[i % len(modes)]) for i, r in enumerate(_arith(6))]
    data = _write(tmp_path / "train.jsonl", rows)
    marker = f"AREAL_TEST_MARK={uuid.uuid4().hex}"
    records = _run(tmp_path, f"train_dataset.path={data}", "train_dataset.shuffle=false", "train_dataset.batch_size=6",
                   "total_train_steps=1", "reward.fn=tests.plugins.by_mode", "reward.workers=2", "reward.timeout=2",
                   "reward.timeout_value=-1", "reward.error_value=-2", "reward.max_error_fraction=1.0",
                   env={marker.split("=")[0]: marker.split("=")[1]})
    r = records[1]
    # each mode is one prompt with 2 answers
    counts = {k: r[f"reward/{k}"] for k in ("timeouts", "errors", "nonfinite", "none", "all_none", "worker_deaths")}
    assert counts == dict.fromkeys(counts, 2.0)
    assert r["reward/by_mode"] == 1.0  # the mean over the samples it gave a number for
    assert r["reward/sampled"] == pytest.approx((2 * 1.0 + 2 * -1.0 + 6 * -2.0 + 2 * 0.0) / 12)
    assert processes_left(marker) == []  # none outlives the run


def test_a_reward_of_1e39_on_one_prompt_in_eight_is_counted_named_once_and_the_run_finishes(tmp_path):
    rows = [dict(r, mode="huge" if i % 8 == 3 else "ok") for i, r in enumerate(_arith(16))]
    data = _write(tmp_path / "train.jsonl", rows)
    proc = cli([*BASE, "trial_name=t", f"train_dataset.path={data}", "train_dataset.shuffle=false",
                "train_dataset.batch_size=8", "total_train_steps=2", "reward.fn=tests.plugins.by_mode"], cwd=tmp_path)
    records = step_records(tmp_path / "outputs" / "grpo" / "t")
    assert [records[s]["reward/out_of_range"] for s in (1, 2)] == [2.0, 2.0]  # its prompt's two answers each step
    assert all(math.isfinite(v) for r in records.values() for v in r.values() if isinstance(v, float))
    lines = [x for x in proc.stderr.splitlines() if "1e+39" in x]
    assert len(lines) == 1 and lines[0].startswith("warning: reward source tests.plugins.by_mode: 2 of 16 samples of "
                                                   "this batch returned a number beyond float32, infinite in the "
                                                   "trainer's tensors (counted in reward/out_of_range"), lines
    assert lines[0].endswith("-> returned 1e+39"), lines


# -- reward models and scoring services --------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> str:
    return tiny_classifier(tmp_path_factory.mktemp("classifier"))


@pytest.fixture
def server(monkeypatch):
    with serving(monkeypatch) as s:
        yield s


def test_a_reward_model_trains_alone_and_weighted_with_a_function(tmp_path, classifier):
    alone = _run(tmp_path, "reward.fn=null", f"reward.model.path={classifier}", trial="alone")
    assert sorted(alone) == [1, 2]
    for r in alone.values():
        assert (r["reward/sampled"] == pytest.approx(r["reward/reward_model"], abs=1e-6)
                and r["reward/reward_model"] != 0)
    mixed = _run(tmp_path, f"reward.model.path={classifier}", "reward.weights=[1.0,0.5]", trial="mixed")
    for r in mixed.values():
        assert r["reward/sampled"] == pytest.approx(r["reward/gsm8k_reward_fn"] + 0.5 * r["reward/reward_model"],
                                                    abs=1e-5)


def test_a_scoring_service_trains_alone_and_weighted_with_a_function(tmp_path, server):
    alone = _run(tmp_path, "reward.fn=null", f"reward.url={server.url}", trial="alone")
    assert sorted(alone) == [1, 2] and len(server.requests) >= 2
    sample = server.requests[0]["samples"][0]
    assert set(sample) == {"prompt", "completion", "answer", "fields"} and "demonstration" in sample["fields"]
    assert "How many" in sample["prompt"] and "####" in sample["answer"]  # the row's own question and answer
    for r in alone.values():  # the service scores a completion by its length (None when empty)
        assert r["reward/remote"] > 0
        if r["reward/none"] == 0:
            assert r["reward/sampled"] == pytest.approx(r["reward/remote"], abs=1e-5)
    mixed = _run(tmp_path, f"reward.url={server.url}", "reward.weights=[2.0,-0.25]", trial="mixed")
    for r in (r for r in mixed.values() if r["reward/none"] == 0):
        assert r["reward/sampled"] == pytest.approx(2 * r["reward/gsm8k_reward_fn"] - 0.25 * r["reward/remote"],
                                                    abs=1e-5)


def test_a_service_that_fails_stops_the_run_naming_the_url_and_the_response(tmp_path, server):
    server.reply = [(500, "Traceback: scorer crashed")] * 100
    proc = cli([*BASE, "trial_name=f", f"reward.url={server.url}", "reward.fn=null", "reward.url_retries=1"],
               cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback (most recent call last)" not in proc.stderr
    assert f"reward service remote at {server.url} failed a batch" in proc.stderr
    assert "HTTP 500, body 'Traceback: scorer crashed'" in proc.stderr
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/score"
    proc = cli([*BASE, "trial_name=r", f"reward.url={url}", "reward.fn=null", "reward.url_retries=1"],
               cwd=tmp_path, check=False)
    assert proc.returncode == 1 and url in proc.stderr and "Traceback (most recent call last)" not in proc.stderr
