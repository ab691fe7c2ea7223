"""``scheduler.type=local``: the training processes on this machine, through torch's elastic launcher."""

from __future__ import annotations

import os
import signal
import uuid

from ..errors import UserError


def run_local(cmd: list[str], *, nprocs: int, run_dir: str) -> None:
    """Run ``cmd`` as ``nprocs`` ranks; rank 0's output is shown, every rank's is kept under
    ``<run_dir>/logs``. A failing rank stops the others and raises ``UserError`` naming it."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    log_dir = os.path.join(run_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"areal-{uuid.uuid4().hex[:8]}", role="rank",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.5,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL, tee={0: Std.ALL}))
    print(f"scheduler.type=local: {nprocs} process{'es' if nprocs != 1 else ''} on this machine; "
          f"logs per rank under {log_dir}", flush=True)
    try:
        elastic_launch(config, entrypoint=cmd[0])(*cmd[1:])
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        raise UserError(f"rank {rank} of {nprocs} failed (exit code {failure.exitcode}); the other ranks were "
                        f"stopped. Its output: {_rank_log(log_dir, rank)}") from None
    except SignalException as e:  # the launcher stopped every rank; report it as the signal it was
        from ..train.loop import Terminated

        if e.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise Terminated(128 + int(e.sigval)) from None


def _rank_log(log_dir: str, rank: int) -> str:
    """The newest ``stderr.log`` of ``rank`` under the elastic launcher's ``<run_id>/attempt_<n>/<rank>/``."""
    found = []
    for root, _, files in os.walk(log_dir):
        if os.path.basename(root) == str(rank) and "stderr.log" in files:
            path = os.path.join(root, "stderr.log")
            found.append((os.path.getmtime(path), path))
    return max(found)[1] if found else log_dir
