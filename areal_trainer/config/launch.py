"""Where the training processes run: ``scheduler`` (AReaL's ``scheduler.type``), ``cluster`` and ``parallel``."""

from dataclasses import dataclass, field
from typing import Any

from .base import Checked, at_least_one, one_of
from .parts import _json_problems


@dataclass
class SchedulerConfig(Checked):
    """Where the training processes run (AReaL's ``scheduler.type``); see ``areal_trainer/launch/``."""

    type: str | None = None
    """null: in this process (or the processes ``accelerate launch`` / ``torchrun`` started). ``local``:
    ``cluster.n_gpus_per_node`` processes on this machine. ``ray``: one process per GPU (``cluster.n_nodes``
    x ``cluster.n_gpus_per_node``) on a Ray cluster. ``slurm``: a Slurm job of ``cluster.n_nodes`` nodes."""
    ray_address: str = "auto"
    """``ray``: the cluster to join: ``auto`` (``RAY_ADDRESS``, else a head on this machine), ``host:port``
    or ``ray://host:port``."""
    slurm_partition: str | None = None
    """``slurm``: the partition (null: the cluster's default)."""
    slurm_account: str | None = None
    """``slurm``: the account charged for the job (null: the user's default)."""
    slurm_time_min: int = 240
    """``slurm``: the job's time limit in minutes."""
    slurm_sbatch_args: dict[str, Any] = field(default_factory=dict)
    """``slurm``: further ``#SBATCH`` options, e.g. ``{qos: high, constraint: h100}``."""
    slurm_executor: str = "slurm"
    """``slurm`` submits with ``sbatch``; ``local`` runs the same job through submitit's local executor on
    this machine (to try a Slurm setup without Slurm)."""
    slurm_wait: bool = False
    """``slurm``: wait for the job to end and exit with its status (default: print the job id and return)."""

    def check(self, key: str) -> list[str]:
        p = one_of(f"{key}.type", self.type, (None, "local", "ray", "slurm"))
        p += one_of(f"{key}.slurm_executor", self.slurm_executor, ("slurm", "local"))
        p += at_least_one(f"{key}.slurm_time_min", self.slurm_time_min)
        return p + _json_problems(f"{key}.slurm_sbatch_args", self.slurm_sbatch_args)


@dataclass
class NameResolveConfig(Checked):
    """AReaL's service discovery settings; processes here meet through torch's rendezvous instead."""

    type: str = "nfs"
    """AReaL's name-resolve backend; not used here."""
    nfs_record_root: str = "/tmp/areal/name_resolve"
    """AReaL's ``nfs`` backend directory; not used here."""
    etcd3_addr: str = "localhost:2379"
    """AReaL's ``etcd3`` backend address; not used here."""
    ray_actor_name: str = "ray_kv_store"
    """AReaL's ``ray`` backend actor; not used here."""


@dataclass
class ClusterConfig(Checked):
    """The machines of a run (AReaL's ``cluster``)."""

    fileroot: str = "outputs"
    """Run directories are <fileroot>/<experiment_name>/<trial_name>."""
    n_nodes: int = 1
    """Nodes for ``scheduler.type=ray`` or ``slurm`` (``local`` is one node)."""
    n_gpus_per_node: int | None = None
    """Training processes per node, one per GPU (null: the GPUs visible here; 1 process on a machine
    without a GPU, where any number of processes can share the CPU over gloo)."""
    cluster_name: str = "local"
    """A label in AReaL; not used here."""
    name_resolve: NameResolveConfig = field(default_factory=NameResolveConfig)

    def check(self, key: str) -> list[str]:
        return at_least_one(f"{key}.n_nodes", self.n_nodes) + at_least_one(
            f"{key}.n_gpus_per_node", self.n_gpus_per_node, nullable=True)



@dataclass
class ParallelConfig(Checked):
    """How the training processes share the models (``dist.py``, ``fsdp.py``)."""

    fsdp: bool = False
    """Shard the policy and critic with FSDP2 over the data-parallel processes (weights, gradients and
    optimizer state split; checkpoints still hold full weights). false: every process holds a full copy and
    gradients are summed (DDP). Launch the processes with ``scheduler.type=local``, ``torchrun`` or
    ``accelerate launch`` (with FSDP, ``accelerate launch --use_fsdp --fsdp_version 2`` is accepted too)."""
