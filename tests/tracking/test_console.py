"""What a run tells the user: the progress bar's accuracy (or held-out mean reward, or distillation's KL),
offline wandb's single line, a reused warm start."""

import torch

from areal_trainer.components import load_config
from areal_trainer.data.datasets import build_samples
from areal_trainer.model.load import load_causal_lm, load_tokenizer
from areal_trainer.tracking.console import ProgressPostfix
from areal_trainer.tracking.logger import StatsLogger
from areal_trainer.train.sft import warm_start


def test_the_bar_keeps_the_latest_accuracy_until_the_next_evaluation():
    postfix = ProgressPostfix()
    assert postfix({"reward/task": 0.25}) == {"reward": "0.250"}  # nothing measured yet
    assert postfix({"reward/task": 0.5, "eval/accuracy": 0.3}) == {"reward": "0.500", "acc": "0.300"}
    assert postfix({"reward/task": 0.75}) == {"reward": "0.750", "acc": "0.300"}
    assert list(postfix({"reward/task": 1.0, "eval/accuracy": 0.4})) == ["reward", "acc"]
    assert postfix({"reward/task": 0.0})["acc"] == "0.400"


def test_a_resumed_bar_starts_from_the_accuracy_in_the_metrics_file():
    records = [{"step": 0, "eval/accuracy": 0.1}, {"step": 1, "reward/task": 0.2}, {"step": 2, "eval/accuracy": 0.6},
               {"step": 3, "reward/task": 0.4}]
    assert ProgressPostfix(records)({"reward/task": 0.5}) == {"reward": "0.500", "acc": "0.600"}


def test_without_a_verifier_the_bar_shows_the_held_out_mean_reward_and_never_acc():
    postfix = ProgressPostfix()
    assert postfix({"reward/task": 0.5, "eval/reward": 0.12}) == {"reward": "0.500", "eval_reward": "0.120"}
    assert postfix({"reward/task": 0.6}) == {"reward": "0.600", "eval_reward": "0.120"}
    # an evaluation whose values were not all 0 or 1 (a verifier chosen in auto) replaces an earlier accuracy
    postfix({"eval/accuracy": 0.3, "eval/reward": 0.3})
    assert postfix({"reward/task": 0.6, "eval/reward": 0.45}) == {"reward": "0.600", "eval_reward": "0.450"}


def test_pure_distillation_shows_its_reverse_kl_not_a_reward():
    postfix = ProgressPostfix([{"step": 0, "eval/accuracy": 0.25, "eval/reward": 0.25}], live="kl")
    assert postfix({"reward/task": 0.0, "distill/reverse_kl": 0.4821}) == {"kl": "0.482", "acc": "0.250"}


def test_offline_wandb_prints_one_line_naming_the_run_and_the_sync_command(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = load_config("grpo", ["+scale=tiny", "trial_name=w"])
    assert cfg.stats_logger.wandb.mode == "offline"  # the default
    log = StatsLogger(str(tmp_path), cfg)
    for step in range(1, 4):
        log.log(step, {"reward/task": step / 10, "eval/accuracy": step / 20})
    log.close()
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("wandb: offline run saved; upload it with `wandb sync ")
    run_dir = lines[0].split("wandb sync ", 1)[1].rstrip("`")
    assert run_dir.startswith(str(tmp_path / "wandb" / "offline-run-"))


def test_a_reused_warm_start_logs_its_loading_time_and_that_it_was_reused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AREAL_TRAINER_CACHE", str(tmp_path))
    cfg = load_config("grpo", ["+scale=tiny"])
    tok = load_tokenizer(cfg.actor.path, key="actor.path")
    samples = build_samples(cfg.train_dataset, tok, "train_dataset")

    def run():
        model = load_causal_lm(cfg.actor.path, tokenizer=tok, dtype="float32", device=torch.device("cpu"), seed=0)
        return warm_start(model, tok, samples, cfg, device=torch.device("cpu")), model

    (first, trained), (again, loaded) = run(), run()
    assert first["sft/cached"] == 0 and first["time/sft"] > 0 and "sft/cached_original_time" not in first
    assert again["sft/cached"] == 1 and again["sft/cached_original_time"] == first["time/sft"]
    assert again["sft/loss"] == first["sft/loss"] and again["sft/steps"] == first["sft/steps"]
    assert 0 < again["time/sft"]  # this run's time: the loading, not the original training
    assert all(torch.equal(a, b) for a, b in zip(trained.state_dict().values(), loaded.state_dict().values()))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("SFT warm start: reused the identical warm start ") and "computed earlier in" in line
