"""``scheduler.type=local`` asks for no more processes than the GPUs it finds (checked without a GPU by
pretending there is one)."""

import pytest
import torch

from areal_trainer.components import load_config
from areal_trainer.errors import UserError
from areal_trainer.launch.command import processes_per_node


def test_more_processes_than_gpus_is_refused_naming_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = load_config("grpo", ["scheduler.type=local", "cluster.n_gpus_per_node=2"])
    with pytest.raises(UserError, match=r"cluster.n_gpus_per_node=2 with scheduler.type=local, but this machine has "
                                        r"1 GPU: lower it to at most 1"):
        processes_per_node(cfg)
    assert processes_per_node(load_config("grpo", ["scheduler.type=local"])) == 1  # null: the GPUs found


def test_without_gpus_the_count_is_what_was_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert processes_per_node(load_config("grpo", ["scheduler.type=local", "cluster.n_gpus_per_node=2"])) == 2
