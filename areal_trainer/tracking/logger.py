"""Where metrics go: ``metrics.jsonl`` in the run directory (one JSON object per step), wandb
(offline by default, so nothing leaves the machine unless ``stats_logger.wandb.mode=online``),
and the console summary lines."""

from __future__ import annotations

import dataclasses
import json
import os
import time


class StatsLogger:
    def __init__(self, run_dir: str, cfg, resume_step: int | None = None):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        os.makedirs(run_dir, exist_ok=True)
        if resume_step is None:
            open(self.path, "w").close()
        else:
            self._truncate_after(resume_step)
        self.wandb = None
        wcfg = cfg.stats_logger.wandb
        if wcfg.mode != "disabled" and os.environ.get("WANDB_MODE") != "disabled":
            import wandb

            self.wandb = wandb.init(
                project=wcfg.project, entity=wcfg.entity, name=f"{cfg.experiment_name}/{cfg.trial_name}",
                group=cfg.experiment_name, tags=list(wcfg.tags), mode=wcfg.mode, dir=run_dir,
                config=dataclasses.asdict(cfg), reinit="finish_previous")
        self.t0 = time.time()

    def _truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone)."""
        if not os.path.exists(self.path):
            return
        keep = []
        with open(self.path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by the kill
                    continue
                if record.get("step", 0) <= step:
                    keep.append(line if line.endswith("\n") else line + "\n")
        with open(self.path, "w") as f:
            f.writelines(keep)

    def log(self, step: int, metrics: dict, extra: dict | None = None) -> None:
        """Append one record; ``extra`` (e.g. the step's prompt ids) goes to the file, not to wandb."""
        record = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()},
                  **(extra or {})}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class NullLogger:
    """The logger of non-main processes: metrics are written once, by the main process."""

    def log(self, step: int, metrics: dict, extra: dict | None = None) -> None:
        pass

    def close(self) -> None:
        pass
