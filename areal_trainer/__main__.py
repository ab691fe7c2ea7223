"""Command line: ``python -m areal_trainer --config-name grpo [overrides]``.

Before Hydra parses anything, ``+key=value`` is made to work for keys the YAML already sets, and
every override is checked against the schema, together with the light checks of the config composed
with the usable ones (``components.early_problems``: nothing that imports torch or transformers),
so that all unknown keys, wrong types, bad values and broken plugin paths are reported together,
before torch loads. Then the whole config is checked (every rule and plugin) before any model loads;
a run that fails before training leaves no run directory behind (``tracking/rundir.py``). The run's
console output also goes to the run log, ``<run dir>/__main__.log`` (``tracking/runlog.py``).
"""

from __future__ import annotations

import os
import sys

DEBUG_ENV = "AREAL_TRAINER_DEBUG"
"""``AREAL_TRAINER_DEBUG=1`` shows the traceback of the errors otherwise reported in one line."""
PRINT_ONLY = ("--cfg", "-c", "--info", "-i", "--resolve", "--shell-completion", "-sc", "--hydra-help", "--version")
"""Hydra's options that print something and run no job: the config's own rules are not in the way of
``--cfg job`` (as when Hydra alone runs), unless an override has a problem too."""


def _fail(msg: str) -> None:
    print(f"Error: {msg}", file=sys.stderr)
    sys.exit(2)


def _error(e: BaseException, code: int = 1) -> None:
    """One ``Error:`` line (with ``AREAL_TRAINER_DEBUG=1`` the traceback first), then exit."""
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        import traceback

        traceback.print_exception(e, file=sys.stderr)
    print(f"Error: {e}", file=sys.stderr)
    sys.exit(code)


def _task(cfg) -> float | None:
    from .tracking import runlog

    with runlog.capture() as log:
        try:
            return _job(cfg, log)
        except Exception:  # a crash: its traceback goes to the run log as well as the terminal
            import traceback

            traceback.print_exc(file=sys.stderr)
            sys.exit(1)


def _job(cfg, log) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from .components import build
    from .config import ConfigError
    from .config.loader import convert
    from .tracking.rundir import RunDirInUse, RunLock, remove_if_unused

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        lock = RunLock(run_dir).acquire()  # before anything is written into the directory
    except RunDirInUse as e:
        log.stop()
        _error(e)
    try:
        components = build(convert(cfg))
    except ConfigError as e:
        lock.release()
        remove_if_unused(run_dir)
        _fail(str(e))  # the run log never opens: nothing is written into the run directory
    try:
        return _train(cfg, components, run_dir, log, lock)
    finally:
        lock.release()


def _train(cfg, components, run_dir: str, log, lock) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from transformers.utils import logging as hf_logging

    from .config import ConfigError
    from .errors import UserError
    from .plugins import PluginError
    from .tracking import record, runlog
    from .tracking.rundir import remove_if_unused
    from .train.loop import Terminated, run
    from .train.state import checkpoint as ckpt
    from .train.state.resume import plan_resume

    tcfg = components.config
    try:
        plan = plan_resume(run_dir, tcfg)  # refused or impossible: nothing is written
    except UserError as e:
        log.stop()
        remove_if_unused(run_dir)
        _error(e)
    if plan.complete:
        log.stop()
        print(f"The run is already complete: {plan.checkpoint} is at step {plan.step}, and total_train_steps="
              f"{tcfg.total_train_steps}. Nothing to do; raise total_train_steps to train further.")
        return None
    # The config's warnings, held so far, go to the file now. With scheduler.type the processes it
    # starts write it (their rank 0), not this launcher.
    log.start(runlog.job_log_path() if tcfg.scheduler.type is None and runlog.writes_run_log() else None)
    starter = lock.owned  # the launcher or a single process; not the ranks it starts
    if starter:
        _announce(plan)
        overrides = list(HydraConfig.get().overrides.task)
        try:
            if plan.checkpoint is None:
                record.write_start(run_dir, cfg, overrides, HydraConfig.get())
            else:
                record.append_resume(run_dir, checkpoint=plan.checkpoint, overrides=overrides, changes=plan.changes,
                                     skipped=plan.skipped)
        except UserError as e:  # a full disk before anything trained
            _error(e)
        ckpt.remove_leftovers(run_dir)
    hf_logging.disable_progress_bar()  # per-file bars while saving checkpoints would drown the step bar
    runlog.quiet_libraries()
    try:
        if tcfg.scheduler.type is not None:  # start the training processes; each runs this job with it null
            from .launch import launch

            launch(tcfg, run_dir)
            return None
        summary = run(components, run_dir=run_dir, resume=plan)
    except (UserError, PluginError, ConfigError) as e:
        remove_if_unused(run_dir)  # only while it holds nothing but Hydra's files (failed before training)
        _error(e)
    except RuntimeError as e:
        from .dist import peer_lost

        if not peer_lost(e):
            raise
        rank = os.environ.get("RANK", "?")
        print(f"Error: rank {rank} lost contact with another rank of the job ({str(e).splitlines()[0][:200]}); "
              "stopping. The failing rank is named by the launcher and its log.", file=sys.stderr)
        sys.exit(1)
    except (KeyboardInterrupt, Terminated) as e:
        how, code = ("SIGTERM", e.code) if isinstance(e, Terminated) else ("Ctrl-C", 130)
        found = ckpt.latest_checkpoint(run_dir)
        where = f"the newest complete checkpoint is {found} (resume with recover.mode=auto)" if found else \
            "no checkpoint was written yet"
        print(f"Stopped by {how}; {where}.", file=sys.stderr)
        sys.exit(code)
    return summary.get("accuracy_after")


def _announce(plan) -> None:
    """Say what a resume does differently: damaged checkpoints skipped, settings that changed."""
    for line in plan.skipped:
        print(f"warning: {line}; skipping it.", file=sys.stderr)
    for line in plan.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if plan.unchecked:
        print(f"warning: {plan.checkpoint} records no settings (written by an older version): changed settings "
              "cannot be checked on this resume.", file=sys.stderr)
    if plan.changes:
        print("resuming with changed settings: " + "; ".join(c.line() for c in plan.changes), flush=True)


def main() -> None:
    from .config.help import handle_help

    code = handle_help(sys.argv[1:])  # before Hydra, whose own --help knows nothing of the schema's keys
    if code is not None:
        sys.exit(code)
    # Nothing here imports torch: a bad command line is answered in about a second.
    from .components import LATER_CHECKS, early_problems
    from .config.overrides import (
        config_dirs,
        config_groups,
        config_name_of,
        group_file_problems,
        normalize_overrides,
    )
    from .config.store import register_configs

    register_configs()
    dirs = config_dirs(sys.argv[1:])
    groups = config_groups(dirs)  # conf/'s and those of a --config-dir
    args = normalize_overrides(sys.argv[1:], groups)
    values = [a for a in args if not a.startswith("-") and "=" in a]
    runs = not any(a.partition("=")[0] in PRINT_ONLY for a in args)
    problems = early_problems(config_name_of(args), values, groups, whole=runs)
    problems += group_file_problems(values, dirs)  # the files of your own config groups
    if problems:
        from .config import ConfigError

        _fail(f"{ConfigError(problems)}\n{LATER_CHECKS}")
    import hydra

    sys.argv = [sys.argv[0], *args]
    hydra.main(version_base="1.3", config_path="pkg://areal_trainer.conf", config_name="config")(_task)()


if __name__ == "__main__":
    main()
