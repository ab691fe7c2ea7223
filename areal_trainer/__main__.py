"""Command line: ``python -m areal_trainer --config-name grpo [overrides]``.

Before Hydra parses anything, ``+key=value`` is made to work for keys the YAML already sets, and
every override is checked against the schema so that all unknown keys and wrong types are
reported together (with the problems of the config composed without those overrides, in one round).
Then the config is validated (every rule and plugin) before any model loads; a run that fails
before training leaves no run directory behind (``tracking/rundir.py``). The run's console output
also goes to the run log, ``<run dir>/__main__.log`` (``tracking/runlog.py``).
"""

from __future__ import annotations

import os
import sys


def _fail(msg: str) -> None:
    print(f"Error: {msg}", file=sys.stderr)
    sys.exit(2)


def _task(cfg) -> float | None:
    from .tracking import runlog

    with runlog.capture() as log:
        return _job(cfg, log)


def _job(cfg, log) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from .components import build
    from .config import ConfigError
    from .config.loader import convert
    from .tracking import runlog
    from .tracking.rundir import remove_if_unused

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        components = build(convert(cfg))
    except ConfigError as e:
        remove_if_unused(run_dir)
        _fail(str(e))  # the run log never opens: nothing is written into the run directory
    tcfg = components.config
    # The config's warnings, held so far, go to the file now. With scheduler.type the processes it
    # starts write it (their rank 0), not this launcher.
    log.start(runlog.job_log_path() if tcfg.scheduler.type is None and runlog.writes_run_log() else None)
    from transformers.utils import logging as hf_logging

    from .errors import UserError
    from .plugins import PluginError
    from .train.checkpoint import latest_checkpoint
    from .train.run import Terminated, run

    hf_logging.disable_progress_bar()  # per-file bars while saving checkpoints would drown the step bar
    try:
        if tcfg.scheduler.type is not None:  # start the training processes; each runs this job with it null
            from .launch import launch

            launch(tcfg, run_dir)
            return None
        summary = run(components, run_dir=run_dir)
    except (UserError, PluginError, ConfigError) as e:
        remove_if_unused(run_dir)  # only while it holds nothing but Hydra's files (failed before training)
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)
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
        found = latest_checkpoint(run_dir)
        where = f"the newest complete checkpoint is {found} (resume with recover.mode=auto)" if found else \
            "no checkpoint was written yet"
        print(f"Stopped by {how}; {where}.", file=sys.stderr)
        sys.exit(code)
    return summary.get("accuracy_after")


def main() -> None:
    from .config.help import handle_help

    code = handle_help(sys.argv[1:])  # before Hydra, whose own --help knows nothing of the schema's keys
    if code is not None:
        sys.exit(code)
    import hydra

    from .components import override_problems
    from .config.overrides import config_name_of, normalize_overrides
    from .config.store import register_configs

    register_configs()
    args = normalize_overrides(sys.argv[1:])
    values = [a for a in args if not a.startswith("-") and "=" in a]
    problems = override_problems(config_name_of(args), values)  # with any, also the config's own problems
    if problems:
        from .config import ConfigError

        _fail(str(ConfigError(problems)))
    sys.argv = [sys.argv[0], *args]
    hydra.main(version_base="1.3", config_path="pkg://areal_trainer.conf", config_name="config")(_task)()


if __name__ == "__main__":
    main()
