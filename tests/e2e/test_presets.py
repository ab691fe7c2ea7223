"""Every algorithm preset trains on the built-in task through the real command line, with finite
metrics and with exactly the per-step metrics recorded in ``golden_presets.json``; the
custom-advantage example runs from YAML paths; DAPO's filter is applied.

The golden records pin the numerics of every preset (3 steps, two minibatches per step so that
ratios, clips and SAPO gates move; a reward with variance inside every group of the untrained model),
computed with the unshared forward (``*.enable_tree_training=false``). A run of that path on the CPU
the records were made on must match them bit for bit (elsewhere: other kernels, other summation
orders, to a relative 1e-5). The sweep itself runs with the defaults, i.e. shared-prefix training,
whose sums run in another order: it must match the records to a relative 1e-4.
Regenerate them deliberately, after a change meant to alter the numbers, with
``AREAL_UPDATE_GOLDEN=1 pytest tests/e2e/test_presets.py``.
"""

import glob
import json
import math
import os
import platform

import pytest

from .helpers import cli

FIRST = ["ppo", "grpo", "drgrpo", "liteppo", "rloo", "dapo", "sapo", "gspo", "icepop", "kpop"]
SHIPPED = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(os.path.dirname(__file__), "..", "..",
                                                                           "conf", "algo", "*.yaml")))
ALGOS = FIRST + [a for a in SHIPPED if a not in FIRST]
"""Every preset in conf/algo: AReaL's ten first (their sweep job numbers stay put), then any added."""
STEPS = 3
GOLDEN = os.path.join(os.path.dirname(__file__), "golden_presets.json")
ARGS = ["+scale=tiny", f"total_train_steps={STEPS}", "gconfig.n_samples=4", "train_dataset.batch_size=4",
        "actor.ppo_n_minibatches=2", "saver.freq_steps=null", f"evaluator.freq_steps={STEPS}",
        "reward.fn=tests.e2e.plugins.digit_share_reward"]


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _cpu() -> str:
    """What decides the float kernels: the CPU model and its vector extensions."""
    name, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                if key.strip() == "flags":
                    flags = " ".join(sorted(x for x in value.split() if x.startswith(("avx", "amx", "fma"))))
                    break
    except OSError:
        pass
    return f"{name} | {flags}"


def _comparable(record: dict) -> dict:
    """Everything but timings and whether the warm start came from the cache."""
    return {k: v for k, v in record.items() if not k.startswith(("time/", "perf/", "sft/cached"))}


def _sharing_off(algo: str) -> list[str]:
    with_critic = "critic:" in open(os.path.join(os.path.dirname(__file__), "..", "..", "conf", "algo",
                                                 f"{algo}.yaml")).read()
    return ["actor.enable_tree_training=false"] + (["critic.enable_tree_training=false"] if with_critic else [])


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("presets")
    if os.environ.get("AREAL_UPDATE_GOLDEN") == "1":  # the records come from the unshared forward
        for i, algo in enumerate(ALGOS):
            cli([f"algo={algo}", *ARGS, *_sharing_off(algo), f"hydra.run.dir=sweep/{i}-{algo}-seed1"], cwd=tmp)
    else:
        cli(["-m", f"algo={','.join(ALGOS)}", *ARGS, "hydra.sweep.dir=sweep"], cwd=tmp, timeout=900)
    return tmp / "sweep"


@pytest.mark.parametrize("i,algo", list(enumerate(ALGOS)))
def test_preset_trains_with_finite_metrics(sweep, i, algo):
    records = _records(sweep / f"{i}-{algo}-seed1")
    steps = [r for r in records if "reward/task" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        for k, v in r.items():
            if isinstance(v, float) and not k.endswith(("/min", "/max")):
                assert math.isfinite(v), (algo, k, v)
        assert r.get("update/skipped_steps", 0) == 0
    if algo == "ppo":
        assert "critic/value_loss" in steps[-1]
    if algo == "sapo":
        assert "actor/sapo/gate" in steps[-1]
    if algo in ("icepop", "kpop"):
        assert "actor/rejection/masked_frac" in steps[-1]
    if algo == "dapo":
        assert "rollout/accept_rate" in steps[-1]


def _golden() -> dict:
    with open(GOLDEN) as f:
        golden = json.load(f)
    assert golden["args"] == ARGS, "the golden records were made with other arguments; regenerate them"
    return golden


def _compare(runs: dict, golden: dict, exact: bool, rel: float = 1e-5) -> None:
    for algo in runs:
        assert algo in golden["runs"], f"no golden record for the preset {algo!r}: regenerate them (module docstring)"
        got, want = runs[algo], golden["runs"][algo]
        assert [r["step"] for r in got] == [r["step"] for r in want], algo
        for g, w in zip(got, want):
            missing = sorted(set(w) - set(g))
            assert not missing, (algo, g["step"], missing)
            for k, v in w.items():
                if exact or not isinstance(v, float):
                    assert g[k] == v, (algo, g["step"], k, g[k], v)
                else:
                    assert g[k] == pytest.approx(v, rel=rel, abs=rel / 100), (algo, g["step"], k)


def test_unshared_forward_matches_golden_records_exactly(tmp_path):
    """PPO (policy, critic and reference) with shared-prefix training off: bit for bit on the records' CPU."""
    cli(["--config-name", "ppo", *ARGS, *_sharing_off("ppo"), "trial_name=unshared"], cwd=tmp_path)
    if os.environ.get("AREAL_UPDATE_GOLDEN") == "1":
        pytest.skip("golden records are being rewritten")
    golden = _golden()
    runs = {"ppo": [_comparable(r) for r in _records(tmp_path / "outputs" / "ppo" / "unshared")]}
    _compare(runs, golden, exact=golden["cpu"] == _cpu())


def test_presets_match_golden_records(sweep):
    """Every preset with the defaults (shared-prefix training on) against the records (with
    ``AREAL_UPDATE_GOLDEN=1`` the sweep runs unshared and rewrites them)."""
    runs = {algo: [_comparable(r) for r in _records(sweep / f"{i}-{algo}-seed1")] for i, algo in enumerate(ALGOS)}
    if os.environ.get("AREAL_UPDATE_GOLDEN") == "1":
        with open(GOLDEN, "w") as f:
            json.dump({"cpu": _cpu(), "args": ARGS, "runs": runs}, f, indent=1, sort_keys=True)
            f.write("\n")
        pytest.skip("golden records rewritten")
    _compare(runs, _golden(), exact=False, rel=1e-4)


def test_custom_advantage_example_from_the_command_line(tmp_path):
    mod = "examples.custom_advantage.my_advantage"
    cli(["--config-name", "grpo", "+scale=tiny", "trial_name=custom",
         f"actor.advantage.outcome_reward_shaping.implementation={mod}.length_penalty",
         "+actor.advantage.outcome_reward_shaping.kwargs.coef=0.1",
         f"actor.advantage.estimator.implementation={mod}.token_gae_kl_outside",
         "actor.gae_lambda=areal_trainer.advantage.lambda_fn.vapo_length_adaptive_gae",
         "+actor.gae_lambda_kwargs.alpha=0.05"], cwd=tmp_path)
    records = _records(tmp_path / "outputs" / "grpo" / "custom")
    assert any("reward/task" in r for r in records)


def test_loss_and_group_baseline_examples_from_the_command_line(tmp_path):
    cli(["--config-name", "grpo", "+scale=tiny", "trial_name=plugins", "actor.ppo_n_minibatches=2",
         "actor.loss.surrogate.implementation=examples.custom_loss.spo.spo", "+actor.loss.surrogate.kwargs.epsilon=0.2",
         "actor.advantage.group_baseline.implementation=examples.group_baseline.pass_at_k.pass_at_k",
         "+actor.advantage.group_baseline.kwargs.k=2"], cwd=tmp_path)
    steps = [r for r in _records(tmp_path / "outputs" / "grpo" / "plugins") if "reward/task" in r]
    assert steps and all("actor/spo/beyond_frac" in r and "actor/clip_frac" not in r for r in steps)
