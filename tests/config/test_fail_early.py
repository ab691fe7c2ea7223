"""Nothing silently useless: settings that would train on zeros or score 0 fail before any model loads,
each message naming the key, the value and the fix; the command line then exits without a traceback
and leaves no run directory; one round reports unknown keys and the config's own problems together."""

import json

import pytest

from areal_trainer.components import load_config
from areal_trainer.config import ConfigError
from areal_trainer.config.schema import DatasetConfig
from areal_trainer.data.datasets import build_samples, check_fits_batch, load_rows
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_tokenizer

from ..e2e.helpers import cli

GROUP_PRESETS = ["grpo", "drgrpo", "liteppo", "rloo", "dapo", "gspo", "icepop", "kpop", "sapo", "cispo"]
SINGLETON = "gconfig.n_samples=1 with actor.reward_norm.mean_level=group"


def _problems(name: str, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(name, overrides)
    return "\n".join(info.value.problems)


def _jsonl(path, rows) -> str:
    path.write_text("".join((json.dumps(r) if r is not None else "") + "\n" for r in rows))
    return str(path)


def _failed_cleanly(proc, tmp_path, code: int) -> None:
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists(), "a failed run left a directory behind"


# -- one answer per prompt with group normalisation ------------------------------------------------------
@pytest.mark.parametrize("name", GROUP_PRESETS)
def test_group_presets_with_one_answer_per_prompt_are_an_error(name):
    text = _problems(name, ["gconfig.n_samples=1"])
    assert SINGLETON in text
    assert "zero advantage after group normalisation" in text and "zero gradient at every step" in text
    assert "Set gconfig.n_samples>=2" in text and "--config-name ppo" in text
    assert "actor.reward_norm.mean_level=batch" in text


def test_ppo_with_one_answer_per_prompt_validates():
    cfg = load_config("ppo", ["gconfig.n_samples=1"])
    assert cfg.gconfig.n_samples == 1 and cfg.actor.reward_norm is None


def test_group_std_alone_with_one_answer_only_warns():
    with pytest.warns(UserWarning, match="std_level=group: the std of a group of one answer is taken as 1"):
        load_config("grpo", ["gconfig.n_samples=1", "actor.reward_norm.mean_level=batch"])


def test_adv_norm_at_group_level_with_one_answer_is_an_error():
    text = _problems("ppo", ["gconfig.n_samples=1", "critic=null", "actor.adv_norm.mean_level=group"])
    assert "gconfig.n_samples=1 with actor.adv_norm.mean_level=group" in text
    assert "actor.adv_norm.mean_level=batch" in text


def test_ppo_with_one_answer_per_prompt_trains(tmp_path):
    cli(["--config-name", "ppo", "+scale=tiny", "gconfig.n_samples=1", "total_train_steps=1", "trial_name=t",
         "saver.freq_steps=null", "stats_logger.plot=false"], cwd=tmp_path)
    assert (tmp_path / "outputs" / "ppo" / "t" / "metrics.jsonl").stat().st_size > 0


def test_cli_one_answer_per_prompt_fails_cleanly(tmp_path):
    proc = cli(["--config-name", "grpo", "gconfig.n_samples=1"], cwd=tmp_path, check=False)
    _failed_cleanly(proc, tmp_path, 2)
    assert SINGLETON in proc.stderr and "--config-name ppo" in proc.stderr


# -- a dataset smaller than one batch --------------------------------------------------------------------
def test_max_rows_below_one_batch_is_a_config_error():
    text = _problems("grpo", ["train_dataset.max_rows=4"])  # batch_size 16
    assert "train_dataset.batch_size=16 is more than train_dataset.max_rows=4 rows of 'builtin:arith'" in text
    assert "Set train_dataset.batch_size=4 or less" in text


def test_fewer_rows_than_one_batch_names_the_key_the_rows_and_the_largest_batch():
    samples = [{"question": "q", "answer": "#### 1"}] * 3
    with pytest.raises(UserError) as info:
        check_fits_batch(samples, DatasetConfig(path="d.jsonl", batch_size=8), "train_dataset", world_size=2)
    msg = str(info.value)
    assert "train_dataset.batch_size=8 is more than the 3 usable rows of train_dataset.path='d.jsonl'" in msg
    assert "Set train_dataset.batch_size=2 or less (a multiple of the 2 processes)" in msg
    check_fits_batch(samples, DatasetConfig(path="d.jsonl", batch_size=3), "train_dataset")
    check_fits_batch(samples, DatasetConfig(path="d.jsonl", batch_size=8, drop_last=False), "train_dataset")


def test_cli_dataset_smaller_than_one_batch_fails_before_the_model_loads(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"question": f"{i} + 1?", "answer": f"#### {i + 1}"} for i in range(3)])
    proc = cli(["--config-name", "grpo", "+scale=tiny", f"train_dataset.path={data}", "train_dataset.batch_size=16",
                "allow_builtin_model_on_any_data=true"], cwd=tmp_path, check=False)
    _failed_cleanly(proc, tmp_path, 1)
    assert f"train_dataset.batch_size=16 is more than the 3 usable rows of train_dataset.path='{data}'" in proc.stderr
    assert "Set train_dataset.batch_size=3 or less" in proc.stderr
    assert "SFT warm start" not in proc.stdout + proc.stderr


# -- dataset rows ----------------------------------------------------------------------------------------
def test_row_error_gives_the_jsonl_line_the_columns_present_and_how_many_more(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"question": "a", "answer": "#### 1"}, {"question": "b", "answer": "#### 2"},
                                         {"question": "c", "solution": "#### 3"},
                                         {"question": "d", "solution": "#### 4"}])
    with pytest.raises(UserError) as info:
        build_samples(DatasetConfig(path=path), build_tokenizer(), "train_dataset")
    msg = str(info.value)
    assert "train_dataset: line 3 of 'd.jsonl': no 'answer' value (or an empty one). Columns in that row: " \
           "'question', 'solution'. Set train_dataset.answer_key to the right column, or fix the rows. (1 more of " \
           "the 4 rows have problems too.)" == msg


def test_a_line_that_is_not_an_object_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "a", "answer": "#### 1"}\n\n["b", "#### 2"]\n')  # blank lines are skipped
    with pytest.raises(UserError, match=r"train_dataset.path: line 3 of 'd.jsonl' is a list, not an object"):
        load_rows(DatasetConfig(path=path), "train_dataset")


def test_row_error_of_a_parquet_file_counts_rows_from_one(tmp_path):
    import datasets

    path = str(tmp_path / "d.parquet")
    datasets.Dataset.from_list([{"question": "a", "answer": "#### 1"},
                                {"question": "b", "answer": " "}]).to_parquet(path)
    with pytest.raises(UserError) as info:
        build_samples(DatasetConfig(path=path), build_tokenizer(), "valid_dataset")
    assert "valid_dataset: row 2 of 'd.parquet': no 'answer' value (or an empty one). Columns in that row: " \
           "'question', 'answer'." in str(info.value)


# -- the built-in model on other data --------------------------------------------------------------------
def test_builtin_model_on_other_data_is_an_error_unless_asked_for(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "#### 1"}])
    text = _problems("grpo", [f"train_dataset.path={data}"])
    assert f"actor.path='builtin:tiny' is the built-in model, whose word-level tokenizer knows only the words of " \
           f"the built-in task (builtin:arith), but train_dataset.path='{data}' is other data" in text
    assert "actor.path=HuggingFaceTB/SmolLM2-135M-Instruct" in text and "allow_builtin_model_on_any_data=true" in text
    cfg = load_config("grpo", [f"train_dataset.path={data}", "allow_builtin_model_on_any_data=true"])
    assert cfg.allow_builtin_model_on_any_data


def test_builtin_tokenizer_or_random_model_on_other_data_is_an_error(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "#### 1"}])
    hub = "actor.path=HuggingFaceTB/SmolLM2-135M-Instruct"
    text = _problems("grpo", [f"valid_dataset.path={data}", hub, "tokenizer_path=builtin:tiny"])
    assert "tokenizer_path='builtin:tiny' is the built-in word-level tokenizer" in text
    assert "Set tokenizer_path=null (the tokenizer of actor.path)" in text
    text = _problems("grpo", [f"train_dataset.path={data}", "tokenizer_path=HuggingFaceTB/SmolLM2-135M-Instruct"])
    assert "actor.path='builtin:tiny' is a small randomly initialised model" in text


def test_cli_builtin_model_on_other_data_fails_cleanly(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "#### 1"}])
    proc = cli(["--config-name", "grpo", f"train_dataset.path={data}"], cwd=tmp_path, check=False)
    _failed_cleanly(proc, tmp_path, 2)
    assert "allow_builtin_model_on_any_data=true" in proc.stderr


# -- run directories -------------------------------------------------------------------------------------
def test_directories_that_existed_before_or_hold_results_are_kept(tmp_path):
    run = tmp_path / "outputs" / "grpo" / "t"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    proc = cli(["--config-name", "grpo", "gconfig.n_samples=1", "trial_name=t"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and (run / "metrics.jsonl").read_text() == "{}\n"
    earlier = tmp_path / "outputs" / "grpo" / "empty"
    earlier.mkdir()
    proc = cli(["--config-name", "grpo", "gconfig.n_samples=1", "trial_name=empty"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and earlier.is_dir()  # not created by that invocation


# -- one round -------------------------------------------------------------------------------------------
def test_load_config_reports_override_and_config_problems_together():
    text = _problems("grpo", ["actor.eps_clp=0.3", "actor.eps_clip=[1", "gconfig.n_samples=1"])
    assert "actor.eps_clp: not a configuration key. Did you mean 'actor.eps_clip'?" in text
    assert "actor.eps_clip=[1: Hydra cannot parse this override" in text
    assert SINGLETON in text


def test_cli_reports_unknown_key_and_cross_field_problems_in_one_round(tmp_path):
    proc = cli(["--config-name", "grpo", "actor.eps_clp=0.3", "gconfig.n_samples=1", "actor.path=./no/such/model"],
               cwd=tmp_path, check=False)
    _failed_cleanly(proc, tmp_path, 2)
    assert "3 configuration problems" in proc.stderr
    for needle in ("Did you mean 'actor.eps_clip'", SINGLETON, "actor.path: './no/such/model' does not exist"):
        assert needle in proc.stderr, needle
