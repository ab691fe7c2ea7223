#!/usr/bin/env bash
# Set up .venv (if needed) and run the main job: GRPO on the built-in arithmetic task.
# Extra arguments are Hydra overrides, e.g.  bash scripts/run.sh total_train_steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
exec .venv/bin/python -m areal_trainer --config-name grpo "$@"
