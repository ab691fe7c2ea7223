#!/usr/bin/env bash
# Set up .venv (if needed), lint, and run the default (CPU) test suite.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k loss
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
.venv/bin/ruff check areal_trainer tests scripts examples
exec .venv/bin/python -m pytest -q -m "not slow" "$@"
