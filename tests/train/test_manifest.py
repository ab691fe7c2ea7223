"""Checkpoint manifests: a truncated, missing or altered file is named; a checkpoint without a manifest
(written before manifests existed) is taken as it is; non-``step_<int>`` entries and leftovers."""

import os

import pytest

from areal_trainer.train.state import checkpoint as ckpt
from areal_trainer.train.state import manifest


@pytest.fixture
def checkpoint(tmp_path):
    root = tmp_path / "ck"
    (root / "actor").mkdir(parents=True)
    (root / "actor" / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    (root / "trainer_state.pt").write_bytes(b"state" * 100)
    manifest.write(str(root))
    return root


def test_intact_files_match(checkpoint):
    assert manifest.problem(str(checkpoint)) is None


def test_truncated_missing_and_altered_files_are_named(checkpoint):
    weights = checkpoint / "actor" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:100])
    assert manifest.problem(str(checkpoint)) == "actor/model.safetensors has 100 bytes, 10240 were written"
    weights.write_bytes(data[:5000] + bytes(64) + data[5064:])
    assert "actor/model.safetensors has the right size but other contents" in manifest.problem(str(checkpoint))
    os.remove(weights)
    assert manifest.problem(str(checkpoint)) == "actor/model.safetensors is missing"


def test_an_unreadable_manifest_and_no_manifest(checkpoint):
    (checkpoint / manifest.MANIFEST).write_text("{not json")
    assert manifest.problem(str(checkpoint)) == "MANIFEST.json is unreadable (JSONDecodeError)"
    os.remove(checkpoint / manifest.MANIFEST)
    assert manifest.problem(str(checkpoint)) is None


def _complete(run, name):
    d = run / "checkpoints" / name
    d.mkdir(parents=True)
    (d / "trainer_state.pt").write_bytes(b"x")
    manifest.write(str(d))
    (d / ckpt.MARKER).write_text("{}")
    return d


def test_only_step_integer_directories_count_and_the_newest_intact_one_is_chosen(tmp_path):
    for name in ("step_1", "step_2", "step_10", "step_final", "step_3_backup"):
        _complete(tmp_path, name)
    assert [s for s, _ in ckpt.checkpoint_dirs(str(tmp_path))] == [1, 2, 10]
    (tmp_path / "checkpoints" / "step_10" / "trainer_state.pt").write_bytes(b"")
    path, skipped = ckpt.resumable(str(tmp_path))
    assert path.endswith("step_2") and skipped == [f"{tmp_path}/checkpoints/step_10 is damaged: trainer_state.pt "
                                                   "has 0 bytes, 1 were written"]


def test_leftovers_are_removed_and_nothing_else(tmp_path):
    _complete(tmp_path, "step_1")
    _complete(tmp_path, "step_final")
    root = tmp_path / "checkpoints"
    for name in (".tmp-step_2-123", "step_1.old-55", "step_3"):
        (root / name).mkdir()
    assert ckpt.remove_leftovers(str(tmp_path)) == [".tmp-step_2-123", "step_1.old-55", "step_3"]
    assert sorted(os.listdir(root)) == ["step_1", "step_final"]


def test_pruning_removes_the_marker_first(tmp_path, monkeypatch):
    d = _complete(tmp_path, "step_1")
    seen = []
    monkeypatch.setattr(ckpt.faults, "point", lambda name: seen.append((name, (d / ckpt.MARKER).exists(),
                                                                       (d / "trainer_state.pt").exists())))
    ckpt.remove_checkpoint(str(d))
    assert seen == [("prune.after_marker", False, True)] and not d.exists()
