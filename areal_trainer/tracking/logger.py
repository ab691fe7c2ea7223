"""Where metrics go: ``metrics.jsonl`` in the run directory (one JSON object per step), wandb
(offline by default, so nothing leaves the machine unless ``stats_logger.wandb.mode=online``),
and the console summary lines. A few sampled trajectories per step go to ``samples.jsonl`` and a
wandb table (``tracking/samples.py`` builds them)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
import warnings

from .. import faults
from ..errors import UserError
from . import space
from .samples import TABLE_COLUMNS, append_samples, table_rows


class StatsLogger:
    def __init__(self, run_dir: str, cfg, resume_step: int | None = None):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.samples_path = os.path.join(run_dir, "samples.jsonl")
        os.makedirs(run_dir, exist_ok=True)
        for name in os.listdir(run_dir):  # a rewrite of an earlier resume, killed before it replaced its file
            if name.startswith(("metrics.jsonl.tmp-", "samples.jsonl.tmp-")):
                os.remove(os.path.join(run_dir, name))
        if resume_step is None:
            open(self.path, "w").close()
            if os.path.exists(self.samples_path):  # an earlier run's; this run may write none
                os.remove(self.samples_path)
        else:
            _truncate_after(self.path, resume_step)
            _truncate_after(self.samples_path, resume_step)
        self.wandb = None
        self.offline_dir: str | None = None
        wcfg = cfg.stats_logger.wandb
        if wcfg.mode != "disabled" and os.environ.get("WANDB_MODE") != "disabled":
            import wandb

            # Offline (the default) wandb's header and ~35-line end-of-run summary repeat what
            # metrics.jsonl holds; it is silenced and close() prints the one useful line instead.
            offline = wcfg.mode == "offline"
            if offline:  # wandb's weave tracing (offered when an LLM client such as openai is imported) needs a server
                os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
            self.wandb = wandb.init(
                project=wcfg.project, entity=wcfg.entity, name=f"{cfg.experiment_name}/{cfg.trial_name}",
                group=cfg.experiment_name, tags=list(wcfg.tags), mode=wcfg.mode, dir=run_dir,
                config=dataclasses.asdict(cfg), reinit="finish_previous",
                settings=wandb.Settings(silent=True) if offline else None)
            if offline:  # Run.sync_dir is newer than wandb 0.17; files live in <sync_dir>/files
                self.offline_dir = getattr(self.wandb, "sync_dir", None) or os.path.dirname(self.wandb.dir)
        self.t0 = time.time()
        self.samples_failed = False

    def log(self, step: int, metrics: dict, extra: dict | None = None) -> None:
        """Append one record; ``extra`` (e.g. the step's prompt ids) goes to the file, not to wandb."""
        record = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()},
                  **(extra or {})}
        try:
            space.append(self.path, [json.dumps(record) + "\n"])
        except space.AppendError as e:  # the run cannot keep its history: stop, its checkpoints intact
            raise UserError(f"{e.strerror} Free some space and resume with recover.mode=auto.") from None
        self._to_wandb(lambda run: run.log(metrics, step=step))

    def log_samples(self, step: int, records: list[dict]) -> None:
        """Append one step's sample records to ``samples.jsonl`` and, with wandb, log them as a table."""
        if not records:
            return
        try:
            append_samples(self.samples_path, step, records)
        except space.AppendError as e:  # samples are for reading, not for the run: warn once, go on
            if not self.samples_failed:
                warnings.warn(f"{e.strerror} The run goes on without writing samples.", stacklevel=2)
            self.samples_failed = True
        if self.wandb is not None:
            import wandb

            table = wandb.Table(columns=list(TABLE_COLUMNS), data=table_rows(step, records))
            self._to_wandb(lambda run: run.log({"samples": table}, step=step))

    def _to_wandb(self, write) -> None:
        """``write(run)``; wandb is a copy of ``metrics.jsonl``, so a failure of its own (a full disk under its
        directory, a service that died) is one warning, and the run goes on without it. wandb writes through a
        process of its own, whose failure reaches the run at a later call if at all: a full disk under its
        directory is taken as that failure at once."""
        if self.wandb is None:
            return
        try:
            write(self.wandb)
        except Exception as e:  # noqa: BLE001 - whatever wandb raises, the run's own record is metrics.jsonl
            self._drop_wandb(f"{type(e).__name__}: {' '.join(str(e).split())[:200] or type(e).__name__}")
            return
        if space.is_full(self._wandb_dir()):
            self._drop_wandb("OSError: [Errno 28] No space left on device (its disk is full; wandb's writer fails "
                             "there on its own)")

    def _wandb_dir(self) -> str:
        return str(self.offline_dir or getattr(self.wandb, "dir", None) or ".")

    def _drop_wandb(self, why: str, *, finish: bool = True) -> None:
        """One warning naming wandb's directory, ``why`` and the free space; the run goes on without wandb."""
        where = self._wandb_dir()
        print(f"warning: wandb cannot write to {where}: {why}. Free space there: "
              f"{space.free_space(where) if os.path.exists(where) else 'unknown'}. The run goes on without wandb; "
              "metrics.jsonl keeps every step, and what wandb wrote so far stays.", file=sys.stderr, flush=True)
        run, self.wandb = self.wandb, None
        _drop_file_logs(where)  # wandb's own log files there would fail on every record too
        if finish and run is not None:
            try:
                run.finish(exit_code=1, quiet=True)
            except Exception:  # noqa: BLE001 - it is broken already; nothing more to save
                pass

    def close(self) -> None:
        if self.wandb is not None:
            run = self.wandb
            try:
                run.finish()
            except Exception as e:  # noqa: BLE001 - the run is over; its record is metrics.jsonl
                self.wandb = None
                warnings.warn(f"wandb could not finish its run in {self.offline_dir or run.dir}: {type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}. metrics.jsonl holds every step.", stacklevel=2)
                return
            if space.is_full(self._wandb_dir()):  # its last records may not have fitted
                self._drop_wandb("OSError: [Errno 28] No space left on device (its disk filled up while wandb "
                                 "finished its run, whose last records may be missing)", finish=False)
                return
            self.wandb = None
            if self.offline_dir:
                print(f"wandb: offline run saved; upload it with `wandb sync {self.offline_dir}`", flush=True)


def _drop_file_logs(where: str) -> None:
    """Close the logging handlers that write files under ``where`` (wandb's debug logs), so that a full disk there
    is not reported again by every later log record."""
    prefix = os.path.abspath(where) + os.sep
    loggers = [logging.getLogger(), *(x for x in logging.root.manager.loggerDict.values()
                                      if isinstance(x, logging.Logger))]
    for logger in loggers:
        for handler in list(logger.handlers):
            name = getattr(handler, "baseFilename", "")
            if isinstance(handler, logging.FileHandler) and os.path.abspath(name).startswith(prefix):
                logger.removeHandler(handler)
                try:
                    handler.close()
                except OSError:
                    pass


def _truncate_after(path: str, step: int) -> None:
    """On resume, drop records of steps after the checkpoint (they will be redone). The kept records go
    to a temporary file that then replaces the original in one step (``os.replace``): a kill at any
    moment leaves either the old history or the new one, never a partial file."""
    if not os.path.exists(path):
        return
    keep = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by the kill
                continue
            if record.get("step", 0) <= step:
                keep.append(line if line.endswith("\n") else line + "\n")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
    faults.point("history.before_replace")
    os.replace(tmp, path)


def read_metrics(path: str) -> list[dict]:
    """The records of ``metrics.jsonl``; a last line cut short by a kill is left out."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class NullLogger:
    """The logger of non-main processes: metrics are written once, by the main process."""

    def log(self, step: int, metrics: dict, extra: dict | None = None) -> None:
        pass

    def log_samples(self, step: int, records: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass
