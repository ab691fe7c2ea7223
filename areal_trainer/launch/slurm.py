"""``scheduler.type=slurm``: a Slurm job of ``cluster.n_nodes`` nodes x ``n_gpus_per_node`` tasks,
submitted through submitit; every task runs the training command under ``srun``.

On preemption or at the time limit submitit requeues the job, and the requeued tasks resume from the
newest complete checkpoint (``recover.mode=auto``); the run checkpoints by ``saver``/``recover``
frequencies as usual. ``scheduler.slurm_executor=local`` runs the same job through submitit's local
executor, for trying a setup where there is no Slurm.
"""

from __future__ import annotations

import os
import subprocess

from ..errors import UserError

PORT_BASE = 20000
"""Rendezvous ports are ``PORT_BASE + job id mod 20000``: distinct for jobs sharing a node."""


class TrainingTask:
    """The function each Slurm task runs (picklable; requeued by :meth:`checkpoint`)."""

    def __init__(self, cmd: list[str], resume: bool = False):
        self.cmd, self.resume = list(cmd), resume

    def __call__(self) -> int:
        import submitit

        job = submitit.JobEnvironment()
        job_id = "".join(ch for ch in str(job.job_id).split("_")[0] if ch.isdigit()) or "0"
        env = {**os.environ, "RANK": str(job.global_rank), "WORLD_SIZE": str(job.num_tasks),
               "LOCAL_RANK": str(job.local_rank), "MASTER_ADDR": job.hostnames[0],
               "MASTER_PORT": str(PORT_BASE + int(job_id) % 20000)}
        cmd = self.cmd + (["recover.mode=auto"] if self.resume else [])
        code = subprocess.run(cmd, env=env).returncode
        if code != 0:
            raise RuntimeError(f"rank {job.global_rank} of {job.num_tasks} exited with status {code}")
        return code

    def checkpoint(self, *args, **kwargs):
        """Called by submitit when the job is preempted or times out: requeue it, resuming."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(TrainingTask(self.cmd, resume=True))


def slurm_parameters(cfg, *, nprocs: int) -> dict:
    """submitit executor parameters for ``cfg`` (``slurm_*`` ones are ignored by the local executor)."""
    s, c = cfg.scheduler, cfg.cluster
    params = dict(name=f"{cfg.experiment_name}-{cfg.trial_name}", nodes=c.n_nodes, tasks_per_node=nprocs,
                  timeout_min=s.slurm_time_min, slurm_additional_parameters=dict(s.slurm_sbatch_args))
    if c.n_gpus_per_node:
        params["gpus_per_node"] = c.n_gpus_per_node
    if s.slurm_partition:
        params["slurm_partition"] = s.slurm_partition
    if s.slurm_account:
        params["slurm_account"] = s.slurm_account
    return params


def submit_slurm(cmd: list[str], cfg, *, nprocs: int, run_dir: str) -> None:
    import submitit

    folder = os.path.join(run_dir, "slurm")
    executor = submitit.AutoExecutor(folder=folder,
                                     cluster="local" if cfg.scheduler.slurm_executor == "local" else None)
    params = slurm_parameters(cfg, nprocs=nprocs)
    if executor.cluster == "local":
        import torch

        params = {k: v for k, v in params.items() if not k.startswith("slurm_") and k != "nodes"}
        if not torch.cuda.is_available():
            params.pop("gpus_per_node", None)  # the processes share the CPU
    executor.update_parameters(**params)
    try:
        job = executor.submit(TrainingTask(cmd))
    except (subprocess.CalledProcessError, OSError, RuntimeError) as e:
        raise UserError(f"scheduler.type=slurm: the job could not be submitted: {e}") from None
    print(f"scheduler.type=slurm: submitted job {job.job_id} ({cfg.cluster.n_nodes} node(s) x {nprocs} task(s)); "
          f"its logs: {folder}/{job.job_id}_*_log.out and .err; training output: {run_dir}", flush=True)
    if cfg.scheduler.slurm_wait or executor.cluster == "local":
        try:
            job.results()
        except Exception as e:  # noqa: BLE001 - submitit wraps the task's error with its traceback
            last = str(e).strip().splitlines()[-1:] or [""]
            raise UserError(f"Slurm job {job.job_id} failed: {last[0]} (logs in {folder})") from None
