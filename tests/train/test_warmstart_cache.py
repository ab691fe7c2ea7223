"""The warm-start cache costs only itself when it cannot be written: a full disk (torch.save's RuntimeError)
or a cache directory that cannot be made is one warning line naming the path, the free space and the size
needed; nothing half-written stays, and what is in the cache is read back as it was."""

from __future__ import annotations

import os

import torch

from areal_trainer.train import sft


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(16, 16)


def test_a_full_disk_costs_the_cache_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AREAL_TRAINER_CACHE", str(tmp_path))

    def full(obj, path):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(sft.torch, "save", full)
    sft.store_cached(_model(), "k1", {"sft/loss": 0.5})
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: cannot store the warm start in the cache "
                                               f"{tmp_path}/warmstart: RuntimeError: [enforce fail")
    assert "Free space there: " in err[0] and "it needs about 1.1 KiB" in err[0]  # 272 float32 weights
    assert "The run goes on without it" in err[0]
    assert os.listdir(tmp_path / "warmstart") == []  # the partial entry was removed
    assert sft.load_cached(_model(), "k1") is None


def test_a_cache_that_cannot_be_made_is_one_warning(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("AREAL_TRAINER_CACHE", str(blocker))
    sft.store_cached(_model(), "k2", {"sft/loss": 0.5})
    err = capsys.readouterr().err
    assert err.startswith(f"warning: cannot store the warm start in the cache {blocker}/warmstart: ") and \
        err.count("\n") == 1


def test_a_stored_warm_start_is_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_TRAINER_CACHE", str(tmp_path))
    model = _model()
    sft.store_cached(model, "k3", {"sft/loss": 0.25})
    other = torch.nn.Linear(16, 16)
    got = sft.load_cached(other, "k3")
    assert got is not None and got["sft/loss"] == 0.25
    assert torch.equal(other.weight, model.weight)


def test_the_key_names_the_kernels_that_computed_the_warm_start(monkeypatch):
    """A warm start computed with other float kernels or another thread count is another warm start: the
    key differs, so portable-kernel runs never reuse a native-kernel warm start (or the reverse)."""
    import subprocess
    import sys

    parts = {"actor": "builtin:tiny", "seed": 1, "steps": 300}
    code = "import torch; from areal_trainer.train import sft; torch.set_num_threads(1); print(sft.warmstart_key(%r))"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}

    def key_in_child(**extra):
        out = subprocess.run([sys.executable, "-c", code % (parts,)], env={**env, **extra}, capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()

    native, portable = key_in_child(), key_in_child(ATEN_CPU_CAPABILITY="default")
    assert native == key_in_child()  # the same kernels: the same key
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        assert native != portable
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sft.warmstart_key(parts)
        torch.set_num_threads(2)
        assert sft.warmstart_key(parts) != one
    finally:
        torch.set_num_threads(before)
