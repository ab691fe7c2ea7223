"""The run's headline through the real command line: held-out accuracy only from a verifier (a reward
model alone reports its mean reward and says so; a weighted mix reports its verifier's accuracy), and
distillation runs that report the reverse KL to the teacher and never say "before RL"."""

import json

import pytest

from .helpers import cli, tiny_classifier

TINY = ["+scale=tiny"]


def _records(run_dir) -> list[dict]:
    with open(run_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def _evals(run_dir) -> list[dict]:
    return [r for r in _records(run_dir) if "eval/reward" in r]


def _bar_lines(run_dir, algo: str) -> list[str]:
    """The run log's one line per step with what the progress bar shows."""
    return [line for line in (run_dir / "__main__.log").read_text().splitlines() if line.startswith(f"{algo} step ")]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> str:
    """A randomly initialised reward model on the built-in tokenizer: scores that say nothing of correctness."""
    return tiny_classifier(tmp_path_factory.mktemp("classifier"))


def test_a_reward_model_alone_reports_no_accuracy_and_names_what_it_reports(tmp_path, classifier):
    proc = cli(["--config-name", "grpo", *TINY, "reward.fn=null", f"reward.model.path={classifier}", "trial_name=rm"],
               cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "rm"
    evals = _evals(run)
    assert [r["step"] for r in evals] == [0, 1, 2] and not any("eval/accuracy" in r for r in _records(run))
    assert "held-out accuracy" not in proc.stdout and " (correct)" not in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("held-out "))
    assert line.startswith(f"held-out mean reward (reward model): {evals[0]['eval/reward']:.3f} at step 0 (before RL) "
                           f"-> {evals[-1]['eval/reward']:.3f} at step 2 (")
    assert line.endswith("no verifier: a reward model scores how good an answer is, not whether it is right; add a "
                         "checking function to reward.fn and name it in evaluator.verifier to report accuracy)")
    assert all(", eval_reward " in x and " acc " not in x for x in _bar_lines(run, "grpo"))


def test_a_weighted_mix_reports_the_accuracy_of_its_verifier_not_of_the_sum(tmp_path):
    # gsm8k_reward_fn plus 0.01 x the completion's length: every held-out reward is positive
    proc = cli(["--config-name", "grpo", *TINY, "reward.fn=[areal_trainer.reward.math.gsm8k_reward_fn,"
                "tests.plugins.length_or_none]", "reward.weights=[1.0,0.01]", "trial_name=mix"], cwd=tmp_path)
    evals = _evals(tmp_path / "outputs" / "grpo" / "mix")
    assert len(evals) == 3
    for r in evals:
        assert r["eval/accuracy"] == r["eval/reward/gsm8k_reward_fn"]  # 0/1 values: their mean is the accuracy
        assert r["eval/reward"] > r["eval/accuracy"]
    first, last = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
    assert (f"held-out accuracy: {100 * first:.1f}% at step 0 (before RL) -> {100 * last:.1f}% at step 2 "
            f"({100 * (last - first):+.1f} points)") in proc.stdout.splitlines()


@pytest.mark.parametrize("preset,teacher,algo,trains_by", [
    ("distill", "teacher.path=builtin:tiny", "distill", "distillation"),
    ("grpo", "+teacher.path=builtin:tiny", "grpo", "training"),
])
def test_distillation_reports_the_reverse_kl_to_the_teacher(tmp_path, preset, teacher, algo, trains_by):
    proc = cli(["--config-name", preset, *TINY, teacher, "trial_name=d"], cwd=tmp_path)
    run = tmp_path / "outputs" / algo / "d"
    evals = _evals(run)
    assert [r["step"] for r in evals] == [0, 1, 2]
    for r in evals:
        assert r["eval/distill/reverse_kl"] > 0 and r["eval/distill/n_valid_tokens"] > 0 and "eval/accuracy" in r
    lines = [x for x in proc.stdout.splitlines() if x.startswith("held-out ")]
    kl = (f"held-out reverse KL to the teacher: {evals[0]['eval/distill/reverse_kl']:.3f} at step 0 (before "
          f"{trains_by}) -> {evals[-1]['eval/distill/reverse_kl']:.3f} at step 2 (nats per answer token)")
    assert kl in lines and lines[0 if trains_by == "distillation" else 1] == kl
    assert any(x.startswith("held-out accuracy: ") and f"(before {trains_by})" in x for x in lines)
    assert "before RL" not in proc.stdout
    bar = _bar_lines(run, algo)
    if trains_by == "distillation":  # it calls no reward in training: the bar shows the KL
        assert bar and all(x.split(": ", 1)[1].startswith("kl ") and "reward" not in x for x in bar)


def test_held_out_reverse_kl_under_fsdp_with_a_sharded_teacher(tmp_path):
    """Two FSDP2 processes, each scoring its share of the held-out answers with its shard of the teacher: the
    teachers' forwards are collectives, so both processes must run as many (a hang would time out)."""
    from .test_fsdp import LAUNCH, _run

    _run([*LAUNCH, "-m", "areal_trainer", "--config-name", "distill", *TINY, "train_dataset.batch_size=4",
          "teacher.path=builtin:tiny", "trial_name=f", "parallel.fsdp=true"], tmp_path)
    evals = _evals(tmp_path / "outputs" / "distill" / "f")
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(r["eval/distill/reverse_kl"] > 0 and r["eval/distill/n_valid_tokens"] > 0 for r in evals)
