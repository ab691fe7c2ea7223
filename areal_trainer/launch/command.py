"""The command every training process runs: this job's command line with ``scheduler.type=null``,
the run directory and trial name pinned (so every process, on any node, writes into one run)."""

from __future__ import annotations

import sys

from ..config.schema import TrainerConfig
from ..errors import UserError

CONFIG_FLAGS = ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd")


def _config_flags(argv: list[str]) -> list[str]:
    """The flags that choose the primary config, as given on this process's command line."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in CONFIG_FLAGS:
            if "=" in arg:
                out.append(arg)
            elif i + 1 < len(argv):
                out += [arg, argv[i + 1]]
                i += 1
        i += 1
    return out


def worker_command(cfg: TrainerConfig, run_dir: str, argv: list[str] | None = None,
                   overrides: list[str] | None = None) -> list[str]:
    """``python -m areal_trainer <config flags> <this job's overrides> scheduler.type=null ...``."""
    if overrides is None:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in ("scheduler.type", "trial_name")]
    return [sys.executable, "-u", "-m", "areal_trainer", *_config_flags(sys.argv[1:] if argv is None else argv),
            *kept, "scheduler.type=null", f"trial_name={cfg.trial_name}", f"hydra.run.dir={run_dir}",
            "hydra.output_subdir=null"]


def processes_per_node(cfg: TrainerConfig) -> int:
    """``cluster.n_gpus_per_node``, or the GPUs visible here (1 without a GPU). For ``local``, no more
    processes than GPUs when there are GPUs."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n = cfg.cluster.n_gpus_per_node or max(gpus, 1)
    if cfg.scheduler.type == "local" and gpus and n > gpus:
        raise UserError(f"cluster.n_gpus_per_node={n} with scheduler.type=local, but this machine has {gpus} "
                        f"GPU{'s' if gpus != 1 else ''}: lower it to at most {gpus} (or leave it null).")
    return n
