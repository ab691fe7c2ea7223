"""``scheduler.type=ray``: one training process per GPU of a Ray cluster.

A placement group reserves one bundle per process (a GPU each, or a CPU on a cluster without
GPUs); a small task on the first bundle picks rank 0's address and a free port for the rendezvous;
then one Ray task per bundle runs the training command with its rank in the environment and waits
for it. Ray places and supervises the processes; the training itself is the same data-parallel
path as under ``torchrun``. The first process to fail cancels the others.
"""

from __future__ import annotations

import os
import subprocess

from ..errors import UserError
from ..tracking.rundir import LOCK_HELD_ENV


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("scheduler.type=ray needs the 'ray' package: pip install -e '.[ray]' "
                        "(or pip install ray).") from None
    return ray


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast on a ``host:port`` nobody listens at (``ray.init`` would retry for minutes)."""
    import socket

    if address in ("auto", "local") or not address:
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise UserError(f"scheduler.ray_address={address!r}: nothing answers there ({e}). Start a head with "
                        "`ray start --head` and give its address (host:port), or use `auto`.") from None


def _address_and_port() -> tuple[str, int]:
    import socket

    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def _run_rank(cmd: list[str], env: dict[str, str], log_path: str) -> int:
    """Run one rank to its end; stdout and stderr go to ``log_path``. Returns its exit status."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    full = {**os.environ, **env}
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")  # Ray gives each GPU task its own device
    if gpus:
        full["CUDA_VISIBLE_DEVICES"] = gpus
    with open(log_path, "w") as log:
        return subprocess.run(cmd, env=full, stdout=log, stderr=subprocess.STDOUT).returncode


def run_ray(cmd: list[str], cfg, *, nprocs: int, run_dir: str) -> None:
    ray = _import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    address = cfg.scheduler.ray_address
    check_reachable(address)
    try:
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UserError(f"scheduler.ray_address={address!r}: cannot connect to a Ray cluster ({e}). Start one "
                        "(`ray start --head`) or give its address (host:port).") from None
    world = cfg.cluster.n_nodes * nprocs
    gpus = int(ray.cluster_resources().get("GPU", 0))
    unit = {"GPU": 1, "CPU": 1} if gpus else {"CPU": 1}
    if gpus and world > gpus:
        raise UserError(f"cluster.n_nodes x cluster.n_gpus_per_node = {world} processes, but the Ray cluster has "
                        f"{gpus} GPUs: lower them.")
    pg = placement_group([unit] * world, strategy="PACK")
    try:
        ready, _ = ray.wait([pg.ready()], timeout=120)
        if not ready:
            raise UserError(f"the Ray cluster at {address!r} cannot place {world} processes of {unit} within 120 s; "
                            "check its free resources (`ray status`) or lower cluster.n_gpus_per_node.")

        def on(i: int, **kw):
            return dict(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                        num_cpus=1, num_gpus=1 if gpus else 0, **kw)

        master, port = ray.get(ray.remote(_address_and_port).options(**on(0)).remote())
        task = ray.remote(_run_rank)
        log_dir = os.path.join(run_dir, "logs")
        # Ray's workers do not inherit this process's environment: the ranks are told that this launcher
        # holds the run directory's lock for them (tracking/rundir.py).
        refs = {task.options(**on(r)).remote(cmd, {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
                                                   "MASTER_ADDR": master, "MASTER_PORT": str(port),
                                                   LOCK_HELD_ENV: os.path.abspath(run_dir)},
                                             os.path.join(log_dir, f"rank{r}.log")): r for r in range(world)}
        print(f"scheduler.type=ray: {world} processes on the Ray cluster at {address!r}; logs under {log_dir}",
              flush=True)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            code = ray.get(done[0])
            if code != 0:
                for ref in pending:
                    ray.cancel(ref, force=True)
                rank = refs[done[0]]
                raise UserError(f"rank {rank} of {world} failed (exit code {code}); the other ranks were stopped. "
                                f"Its output: {os.path.join(log_dir, f'rank{rank}.log')}")
    finally:
        remove_placement_group(pg)
        ray.shutdown()
