"""Diverged checkpoints: the weight statistics a checkpoint's marker records, how checkpoints are judged
from them, and a resume refused (non-finite weights) or warned (an exploded norm) before anything loads."""

import json
import math

import pytest
import torch

from areal_trainer.errors import UserError
from areal_trainer.train.state import checkpoint as ckpt
from areal_trainer.train.state import divergence
from areal_trainer.train.state.resume import plan_resume


def test_weight_stats_by_hand():
    state = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]]), "steps": torch.tensor(7),
             "empty": torch.ones(0)}
    assert ckpt.weight_stats(state) == {"finite": True, "norm": 5.0}  # integers and empty tensors left out
    assert ckpt.weight_stats({"a": torch.tensor([1.0, math.nan])}) == {"finite": False, "norm": math.inf}
    assert ckpt.weight_stats({"a": torch.tensor([math.inf])}) == {"finite": False, "norm": math.inf}
    big = ckpt.weight_stats({"a": torch.full((4,), 1e200, dtype=torch.float64)})  # finite, norm beyond float64
    assert big == {"finite": True, "norm": math.inf}


def plant(run_dir, step: int, norm: float | None, finite: bool = True, start: float | None = 10.0) -> str:
    path = run_dir / "checkpoints" / f"step_{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.pt").write_bytes(b"")
    weights = {} if norm is None else {"actor": {"finite": finite, "norm": norm if finite else math.inf}}
    (path / ckpt.MARKER).write_text(json.dumps({"step": step, "weights": weights, "start_norm": start}))
    return str(path)


def test_checkpoints_are_judged_against_the_last_healthy_one_and_the_start(tmp_path):
    paths = [plant(tmp_path, 1, 11.0), plant(tmp_path, 2, 150.0), plant(tmp_path, 3, 12.0), plant(tmp_path, 4, None),
             plant(tmp_path, 5, 0.0, finite=False)]
    found = ckpt.checkpoint_dirs(str(tmp_path))
    wrong = [w for _, _, w in divergence.judged(found)]
    assert wrong[0] is None and wrong[2] is None and wrong[3] is None  # unrecorded: nothing known against it
    assert wrong[1] == f"its actor weight norm, 150, is 13.6x that of {paths[0]} (11)"
    assert wrong[4] == "its actor weights are not all finite"
    assert divergence.last_healthy(found, paths[4]) == paths[3]
    assert divergence.last_healthy(found, paths[2]) == paths[0]
    assert divergence.how_to_resume_from(paths[0], found, paths[1]) == (
        f"The last healthy checkpoint is {paths[0]}: remove the newer ones (rm -r {' '.join(paths[1:])}) and resume "
        "again with recover.mode=auto and a lower actor.optimizer.lr.")


def test_the_first_checkpoint_is_judged_against_the_start(tmp_path):
    plant(tmp_path, 1, 101.0, start=10.0)
    assert divergence.judged(ckpt.checkpoint_dirs(str(tmp_path)))[0][2] == (
        "its actor weight norm, 101, is 10.1x that of the run's start (10)")


class Cfg:
    class recover:  # noqa: N801 - the config's section name
        mode = "auto"

    total_train_steps = 100


def test_a_resume_of_non_finite_weights_is_refused_naming_the_last_healthy_checkpoint(tmp_path):
    good = plant(tmp_path, 1, 11.0)
    bad = plant(tmp_path, 2, 0.0, finite=False)
    with pytest.raises(UserError) as e:
        plan_resume(str(tmp_path), Cfg)
    assert str(e.value) == (
        f"recover.mode=auto: {bad} cannot be resumed: its actor weights are not all finite (recorded when it was "
        f"saved), so every step from it would be non-finite. The last healthy checkpoint is {good}: remove the newer "
        f"ones (rm -r {bad}) and resume again with recover.mode=auto and a lower actor.optimizer.lr.")


def test_a_resume_of_exploded_weights_is_a_warning(tmp_path):
    plant(tmp_path, 1, 11.0)
    exploded = plant(tmp_path, 2, 5e6)
    plan = plan_resume(str(tmp_path), Cfg)
    assert plan.checkpoint == exploded and len(plan.warnings) == 2
    assert "has no MANIFEST.json" in plan.warnings[1]  # planted without one
    assert plan.warnings[0].startswith(f"{exploded} may have diverged: its actor weight norm, 5e+06, is 4.55e+05x")
