"""Checkpoints are atomic: only directories with the completion marker count, old ones are pruned; the
RNG states of every rank that the caller gathered are what the checkpoint keeps."""

import os

import torch

from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.train.state import checkpoint as ckpt


def test_save_load_and_prune(tmp_path):
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    for step in (1, 2, 3):
        ckpt.save_checkpoint(str(tmp_path), step, models={"actor": model}, tokenizer=tok, state={"x": step},
                             keep_last=2)
    assert [s for s, _ in ckpt.checkpoint_dirs(str(tmp_path))] == [2, 3]
    path = ckpt.latest_checkpoint(str(tmp_path))
    assert ckpt.load_trainer_state(path)["x"] == 3
    assert os.path.isfile(os.path.join(path, "actor", "config.json"))


def test_incomplete_checkpoint_is_ignored(tmp_path):
    os.makedirs(tmp_path / "checkpoints" / "step_9" / "actor")  # crashed mid-save: no marker
    os.makedirs(tmp_path / "checkpoints" / ".tmp-step_10-1")
    assert ckpt.latest_checkpoint(str(tmp_path)) is None


def test_rng_state_round_trip():
    state = ckpt.rng_state()
    a = torch.rand(3)
    ckpt.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))


def test_every_ranks_rng_state_given_by_the_caller_is_kept(tmp_path):
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    ranks = [ckpt.rng_state()]
    torch.rand(5)
    ranks.append(ckpt.rng_state())  # a second rank's, elsewhere in its stream
    ckpt.save_checkpoint(str(tmp_path), 1, models={"actor": model}, tokenizer=tok, state={"rng": ranks}, keep_last=1)
    saved = ckpt.load_trainer_state(ckpt.latest_checkpoint(str(tmp_path)))["rng"]
    assert isinstance(saved, list) and len(saved) == 2
    assert all(torch.equal(s["torch"], r["torch"]) for s, r in zip(saved, ranks))
    assert not torch.equal(saved[0]["torch"], saved[1]["torch"])
