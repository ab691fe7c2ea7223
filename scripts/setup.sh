#!/usr/bin/env bash
# Create (or reuse) .venv and install areal_trainer with its dev extras.
#
# torch is installed first and on its own: on a machine without CUDA we take the 2.13.0
# CPU build, because installing accelerate/transformers into a venv without torch makes
# pip resolve the newest torch, which is the multi-GB CUDA build. Set TORCH_SPEC to
# override (e.g. TORCH_SPEC="torch==2.8.0" on a GPU box), or install torch yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
source scripts/pip_quiet.sh
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    spec="$TORCH_SPEC"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    spec="torch"
  else
    spec="torch==2.13.0"
  fi
  pipq install "$spec"
fi
pipq install -e ".[dev]"
