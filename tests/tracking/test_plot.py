"""The run's curves: the held-out panel says accuracy only when every evaluation reported one, and pure
distillation plots its reverse KL instead of a reward it never computed."""

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from areal_trainer.tracking.plot import _held_out, _training, held_out_kind, plot_run  # noqa: E402

ACC = [{"step": 0, "eval/accuracy": 0.2, "eval/reward": 0.2}, {"step": 1, "reward/task": 0.5},
       {"step": 1, "eval/accuracy": 0.4, "eval/reward": 0.4}]
REWARD = [{"step": 0, "eval/reward": 0.12}, {"step": 1, "reward/task": 0.5}, {"step": 1, "eval/reward": 0.56}]


def test_held_out_kind():
    assert held_out_kind(ACC) == "accuracy" and held_out_kind(REWARD) == "reward"
    assert held_out_kind(ACC[:1] + REWARD[1:]) == "reward"  # one evaluation without accuracy: none is claimed
    assert held_out_kind([{"step": 1, "reward/task": 0.5}]) is None


def _title(draw, *args) -> str:
    fig, ax = plt.subplots()
    draw(ax, *args)
    title = ax.get_title()
    plt.close(fig)
    return title


def test_the_held_out_panel_is_named_for_what_it_shows():
    assert _title(_held_out, ACC, "gsm8k_reward_fn") == "held-out accuracy"
    assert _title(_held_out, REWARD, "reward model") == "held-out mean reward (reward model; no verifier)"
    assert _title(_held_out, [], "reward") == "held-out evaluation"


def test_pure_distillation_plots_the_reverse_kl():
    records = [{"step": 1, "reward/task": 0.0, "distill/reverse_kl": 0.5}, {"step": 1, "eval/distill/reverse_kl": 0.9}]
    assert _title(_training, records, True) == "reverse KL to the teacher"
    assert _title(_training, records, False) == "training reward (sampled)"


def test_plot_run_writes_the_png(tmp_path):
    with open(os.path.join(tmp_path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in REWARD)
    path = plot_run(str(tmp_path), title="t", reward_label="reward model")
    assert os.path.getsize(path) > 1000
