"""What the built samples say about the run, decided before any model's weights load (the data is built
first in ``Trainer.__init__``): problems that stop it, all reported at once, and notices worth a line.

* **Problems** (one ``ConfigError``): a reward function that needs a column no row has (checked for the
  datasets whose answers reward functions score: not for agent runs, whose agents give the reward, nor
  for the training rollouts of pure distillation); ``sft_warmup.steps`` set above 0 for data with nothing
  to imitate (``sft.py``: :func:`~areal_trainer.train.sft.plan_warm_start`).
* **Notices** (stdout, the main process only): a warm start skipped or trained on some of the rows; a
  ``total_train_steps`` that the epochs cut short (``data/loader.py``:
  :func:`~areal_trainer.data.loader.run_length`).
* **A warning** (stderr): words of the prompts the tokenizer cannot spell (``data/vocab.py``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..components import Components
from ..data.datasets import field_names
from ..data.loader import run_length, steps_per_epoch
from ..data.vocab import unknown_words, unknown_words_warning
from ..errors import ConfigError
from .sft import WarmStartPlan, plan_warm_start


@dataclass(frozen=True)
class Preflight:
    """What the trainer takes from the checks."""

    warm: WarmStartPlan
    """The warm start (none on a resume, which never runs one)."""
    total_steps: int
    """The step the run stops at."""


def preflight(components: Components, tokenizer, train: list[dict], valid: list[dict] | None, *,
              resuming: bool, main: bool) -> Preflight:
    """Check ``train`` and ``valid`` (the built samples) against the rest of the run; raises ``ConfigError``
    with every problem; prints the notices and the warning when ``main``."""
    cfg = components.config
    warm = WarmStartPlan(0) if resuming else plan_warm_start(train, cfg)
    problems = [*warm.problems, *components.reward.column_problems(_scored_columns(components, train, valid))]
    if problems:
        raise ConfigError(problems)
    d = cfg.train_dataset
    total, length_notice = run_length(cfg.total_train_epochs, cfg.total_train_steps,
                                      steps_per_epoch(len(train), d.batch_size, d.drop_last), len(train), d.batch_size)
    if main:
        for line in (warm.notice, length_notice):
            if line:
                print(f"notice: {line}", flush=True)
        found = {k: w for k, s in (("train_dataset", train), ("valid_dataset", valid or []))
                 if (w := unknown_words(tokenizer, s)) is not None}
        if found:
            key = "tokenizer_path" if cfg.tokenizer_path else "actor.path"
            print(f"warning: {unknown_words_warning(found, key, cfg.tokenizer_path or cfg.actor.path)}",
                  file=sys.stderr, flush=True)
    return Preflight(warm, total)


def _scored_columns(components: Components, train: list[dict], valid: list[dict] | None) -> dict[str, frozenset]:
    """The columns of each dataset whose answers the reward functions score (see the module docstring)."""
    if components.config.rollout.agent is not None:
        return {}
    distill = components.distill
    out = {} if distill is not None and distill.pure else {"train_dataset": field_names(train)}
    if valid is not None:
        out["valid_dataset"] = field_names(valid)
    return out
