"""A collective failing because another rank died is reported as that, without a traceback."""

import pytest

from areal_trainer.dist import peer_lost

GLOO = ("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:62629: Connection reset by peer. "
        "This is typically caused by a remote worker hanging")


@pytest.mark.parametrize("world,exc,expected", [
    ("2", RuntimeError(GLOO), True),
    ("2", RuntimeError("NCCL communicator was aborted on rank 0"), True),
    ("1", RuntimeError(GLOO), False),  # a single process has no peers: a real error, shown in full
    ("2", RuntimeError("shape mismatch"), False),
    ("2", ValueError("Connection reset by peer"), False),
])
def test_peer_lost(monkeypatch, world, exc, expected):
    monkeypatch.setenv("WORLD_SIZE", world)
    assert peer_lost(exc) is expected
