"""The sweep summary: job order, and the reward that is comparable across algorithms."""

import json
import os

from areal_trainer.tracking.sweep import collect, summarize


def _write_run(root, name, config: str, records: list[dict]) -> None:
    """A run directory of a sweep: its recorded configuration (YAML) and its metrics records."""
    d = os.path.join(root, name)
    os.makedirs(os.path.join(d, ".hydra"))
    with open(os.path.join(d, ".hydra", "config.yaml"), "w") as f:
        f.write(config)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def _run(root, name, algo, seed, rewards, sampled=None, acc=(0.2, 0.5)):
    steps = [{"step": i, "reward/task": r, "time/step": 1.0} for i, r in enumerate(rewards, 1)]
    for rec, value in zip(steps, sampled or ()):
        rec["reward/sampled"] = value
    _write_run(root, name, f"algorithm: {algo}\nseed: {seed}\n",
               [{"step": 0, "eval/accuracy": acc[0]}, *steps, {"step": len(rewards), "eval/accuracy": acc[1]}])


def test_jobs_in_hydra_order_and_sampled_reward_preferred(tmp_path):
    _run(tmp_path, "2-grpo-seed1", "grpo", 1, [0.1, 0.3])
    _run(tmp_path, "10-dapo-seed1", "dapo", 1, [0.9, 0.9], sampled=[0.2, 0.4])  # filtered batch vs all answers
    runs = collect(str(tmp_path))
    assert [r["dir"] for r in runs] == ["2-grpo-seed1", "10-dapo-seed1"]
    assert runs[0]["reward_last"] == 0.2  # reward/task when nothing else is logged
    assert abs(runs[1]["reward_last"] - 0.3) < 1e-12  # reward/sampled, not the filtered batch's 0.9
    md, png = summarize(str(tmp_path))
    assert "| dapo | 1 | 20.0% | 50.0% | +30.0 | 0.300 | 1.000 |" in md
    assert os.path.getsize(png) > 1000


def test_off_policy_runs_are_labelled_and_get_their_own_table(tmp_path):
    for eta, stale in ((0, 0.0), (2, 1.5)):
        steps = [{"step": i, "reward/task": 0.5, "actor/staleness": stale, "actor/staleness/max": 2 * stale,
                  "actor/clip_frac": 0.1 * i, "mismatch/abs_logp_diff": 0.01} for i in (1, 2)]
        _write_run(tmp_path, f"{eta}-naive",
                   f"algorithm: naive\nseed: 1\nrollout:\n  max_head_offpolicyness: {eta}\n  dtype: bfloat16\n",
                   [{"step": 0, "eval/accuracy": 0.2}, *steps, {"step": 2, "eval/accuracy": 0.4}])
    md, _ = summarize(str(tmp_path))
    assert "| naive bfloat16 | 1 |" in md and "| naive η=2 bfloat16 | 1 |" in md
    assert "| naive η=2 bfloat16 | 1.5 | 3 | 0.15 | 0.01 | - | - |" in md


def test_offpolicy_grid_has_a_cell_per_correction_and_eta_and_says_when_seeds_are_missing(tmp_path):
    from examples.offpolicy.grid import grid

    for corr, eta, seed, acc in (("naive", 0, 1, 0.4), ("naive", 0, 2, 0.6), ("naive", 2, 1, 0.5), ("naive", 2, 2, 0.7),
                                 ("icepop", 2, 1, 0.45)):
        _write_run(tmp_path, f"{corr}-{eta}-{seed}",
                   f"algorithm: {corr}\nseed: {seed}\nrollout:\n  max_head_offpolicyness: {eta}\n",
                   [{"step": 0, "eval/accuracy": 0.2},
                    {"step": 1, "reward/task": 0.5, "actor/staleness": eta / 2,
                     "actor/rejection/masked_frac": 0.01 * eta},
                    {"step": 1, "eval/accuracy": acc}])
    md = grid(collect(str(tmp_path)))
    assert "| correction | η=0 | η=2 |" in md
    assert "| naive | 50.0% (+30.0) | 60.0% (+40.0) |" in md  # the mean of two seeds
    assert "| icepop | - | 45.0% (+25.0) n=1 |" in md  # fewer seeds than the fullest cell: said so
    assert "| icepop | - | 0.0200 |" in md  # masked fraction


def _reward_only_run(root, name, algo, seed, held_out):
    _write_run(root, name, f"algorithm: {algo}\nseed: {seed}\n",
               [{"step": 0, "eval/reward": held_out[0]}, {"step": 1, "reward/task": 0.5, "time/step": 2.0},
                {"step": 1, "eval/reward": held_out[1]}])


def test_runs_without_a_verifier_report_their_mean_held_out_reward_never_an_accuracy(tmp_path):
    _reward_only_run(tmp_path, "0-grpo-seed1", "grpo", 1, (0.12, 0.56))
    _reward_only_run(tmp_path, "1-grpo-seed2", "grpo", 2, (0.10, 0.30))
    runs = collect(str(tmp_path))
    assert runs[0]["held_out"] == "reward" and runs[0]["acc_before"] is None and runs[0]["after"] == 0.56
    md, _ = summarize(str(tmp_path))
    assert "| algorithm | seed | held-out mean reward before RL | after RL | change |" in md
    assert "| grpo | 1 | 0.120 | 0.560 | +0.440 | 0.500 | 2.000 |" in md
    assert "| grpo | 2 | 0.430 | +0.320 | 0.500 |" in md  # the mean over seeds: after 0.43, change +0.32
    assert "acc." not in md and "%" not in md


def test_a_sweep_mixing_both_says_which_number_is_which(tmp_path):
    _run(tmp_path, "0-grpo-seed1", "grpo", 1, [0.1, 0.3])
    _reward_only_run(tmp_path, "1-rm-seed1", "rm", 1, (0.12, 0.56))
    md, _ = summarize(str(tmp_path))
    assert "| algorithm | seed | held-out acc. or mean reward* before RL | after RL | change* |" in md
    assert "| grpo | 1 | 20.0% | 50.0% | +30.0 |" in md and "| rm | 1 | 0.120 | 0.560 | +0.440 |" in md
    assert "* a percentage is a held-out accuracy (points of change); a number with three decimals is the held-out " \
           "mean reward of a run without a verifier." in md
