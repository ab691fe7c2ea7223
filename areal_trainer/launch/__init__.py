"""Starting the training processes that ``scheduler.type`` asks for, each through an existing engine,
so AReaL command lines scale out unchanged:

* ``local``: ``cluster.n_gpus_per_node`` processes on this machine, through torch's elastic launcher
  (what ``torchrun`` runs), the same data-parallel / FSDP2 path ``accelerate launch`` gives;
* ``ray``: ``cluster.n_nodes x cluster.n_gpus_per_node`` processes placed on a Ray cluster with a
  placement group (one per GPU), rank 0's node as the rendezvous;
* ``slurm``: a Slurm job of ``cluster.n_nodes`` nodes x ``n_gpus_per_node`` tasks, submitted with
  submitit, each task under ``srun``; preempted or timed-out jobs requeue and resume (``recover.mode=auto``).

Every process runs this command line again with ``scheduler.type=null``, the same run directory and
trial name (``command.py``), and joins the process group from the environment the engine sets
(``dist.py``). Logs go to ``<run_dir>/logs`` per rank; a failing rank stops the whole job with a
message naming it. Nothing here loads a model.
"""

from __future__ import annotations

from ..config.schema import TrainerConfig


def launch(cfg: TrainerConfig, run_dir: str) -> None:
    """Run the job ``cfg`` describes on the processes ``cfg.scheduler.type`` asks for; raises
    ``UserError`` when one of them fails."""
    from .command import processes_per_node, worker_command

    cmd = worker_command(cfg, run_dir)
    nprocs = processes_per_node(cfg)
    if cfg.scheduler.type == "local":
        from .local import run_local

        run_local(cmd, nprocs=nprocs, run_dir=run_dir)
    elif cfg.scheduler.type == "ray":
        from .ray_cluster import run_ray

        run_ray(cmd, cfg, nprocs=nprocs, run_dir=run_dir)
    else:
        from .slurm import submit_slurm

        submit_slurm(cmd, cfg, nprocs=nprocs, run_dir=run_dir)
