"""Every algorithm preset trains on the built-in task through the real command line, with finite
metrics and with the per-step metrics recorded in ``golden_presets.json``; the custom-advantage
example runs from YAML paths; DAPO's filter is applied.

The golden records pin the numerics of every preset (``tests/golden.py``: the configuration, and the
tolerance of every metric with its reason), computed with the unshared forward
(``*.enable_tree_training=false``). On the machine and kernels that wrote them, an unshared run
matches them bit for bit; elsewhere (another CPU, ``ATEN_CPU_CAPABILITY``, another thread count)
each metric within its tolerance. The sweep itself runs with the defaults, i.e. shared-prefix
training, whose sums run in another order: it is compared within the same tolerances.
Regenerate the records deliberately, after a change meant to alter the numbers, with
``AREAL_UPDATE_GOLDEN=1 pytest tests/e2e/test_presets.py`` (CONTRIBUTING.md).
"""

import json
import math
import os

import pytest

from .. import golden
from .helpers import cli

ALGOS = golden.presets()
UPDATE = os.environ.get("AREAL_UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Every preset's metrics; with ``AREAL_UPDATE_GOLDEN=1`` unshared (the records' forward)."""
    return golden.run_presets(tmp_path_factory.mktemp("presets"), shared=not UPDATE)


@pytest.fixture(scope="module")
def records():
    recorded = golden.load_records()
    assert recorded["args"] == golden.ARGS, "the golden records were made with other arguments; regenerate them"
    return recorded


@pytest.mark.parametrize("algo", ALGOS)
def test_preset_trains_with_finite_metrics(sweep, algo):
    steps = [r for r in sweep[algo] if "reward/task" in r]
    assert [r["step"] for r in steps] == list(range(1, golden.STEPS + 1))
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


def _assert_within(runs: dict, records: dict, exact: bool) -> None:
    bad = golden.deviations(runs, records["runs"], exact=exact)
    assert not bad, f"{len(bad)} metrics differ from the records ({'bit for bit' if exact else 'tolerance'}):\n" + \
        "\n".join(map(str, bad[:20]))


def test_unshared_forward_matches_golden_records(tmp_path, records):
    """PPO (policy, critic and reference) with shared-prefix training off: bit for bit on the records'
    machine and kernels, within each metric's tolerance elsewhere."""
    if UPDATE:
        pytest.skip("golden records are being rewritten")
    runs = golden.run_presets(tmp_path, shared=False, algos=["ppo"])
    _assert_within(runs, records, exact=records["kernels"] == golden.kernels())


def test_golden_records_hold_under_other_kernels(tmp_path, records):
    """The same run with the portable (non-vectorised) kernels and two threads, as on a CPU unlike the
    records': every metric within its tolerance."""
    if UPDATE:
        pytest.skip("golden records are being rewritten")
    env = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"}
    runs = golden.run_presets(tmp_path, shared=False, algos=["ppo", "sapo"], env=env)
    _assert_within(runs, records, exact=False)


@pytest.mark.parametrize("change", [
    "actor.eps_clip=0.02",  # a clip range that binds in the second minibatch
    "actor.adv_norm.std_unbiased=false",  # a sqrt(n/(n-1)) = 1.008 scale of every advantage
    "actor.adv_norm.eps=1e-3",  # a 0.1% change of every advantage
])
def test_a_changed_algorithm_is_caught_by_the_tolerances(tmp_path, records, change):
    """The cross-CPU tolerances are far tighter than what a real change of a preset's maths does."""
    if UPDATE:
        pytest.skip("golden records are being rewritten")
    runs = golden.run_presets(tmp_path, shared=False, algos=["grpo"], extra=[change])
    bad = golden.deviations(runs, records["runs"], exact=False)
    assert bad, f"{change} went unnoticed"


def test_every_recorded_metric_has_a_tolerance_rule(records):
    if UPDATE:
        pytest.skip("golden records are being rewritten")
    keys = {k for runs in records["runs"].values() for r in runs for k in r}
    assert not [k for k in sorted(keys) if golden.rule_of(k) is None], "add a rule to tests/golden.py RULES"


def test_presets_match_golden_records(sweep, records):
    """Every preset with the defaults (shared-prefix training on) against the records (with
    ``AREAL_UPDATE_GOLDEN=1`` the sweep runs unshared and rewrites them)."""
    if UPDATE:
        with open(golden.RECORDS, "w") as f:
            json.dump({"kernels": golden.kernels(), "args": golden.ARGS, "runs": sweep}, f, indent=1, sort_keys=True)
            f.write("\n")
        pytest.skip("golden records rewritten")
    _assert_within(sweep, records, exact=False)


def test_custom_advantage_example_from_the_command_line(tmp_path):
    mod = "examples.custom_advantage.my_advantage"
    cli(["--config-name", "grpo", "+scale=tiny", "trial_name=custom",
         f"actor.advantage.outcome_reward_shaping.implementation={mod}.length_penalty",
         "+actor.advantage.outcome_reward_shaping.kwargs.coef=0.1",
         f"actor.advantage.estimator.implementation={mod}.token_gae_kl_outside",
         "actor.gae_lambda=areal_trainer.advantage.lambda_fn.vapo_length_adaptive_gae",
         "+actor.gae_lambda_kwargs.alpha=0.05"], cwd=tmp_path)
    records = golden.read_run(tmp_path / "outputs" / "grpo" / "custom")
    assert any("reward/task" in r for r in records)


def test_loss_and_group_baseline_examples_from_the_command_line(tmp_path):
    cli(["--config-name", "grpo", "+scale=tiny", "trial_name=plugins", "actor.ppo_n_minibatches=2",
         "actor.loss.surrogate.implementation=examples.custom_loss.spo.spo", "+actor.loss.surrogate.kwargs.epsilon=0.2",
         "actor.advantage.group_baseline.implementation=examples.group_baseline.pass_at_k.pass_at_k",
         "+actor.advantage.group_baseline.kwargs.k=2"], cwd=tmp_path)
    steps = [r for r in golden.read_run(tmp_path / "outputs" / "grpo" / "plugins") if "reward/task" in r]
    assert steps and all("actor/spo/beyond_frac" in r and "actor/clip_frac" not in r for r in steps)
