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
pipq() {  # quiet pip, without the warnings about package-index folders absent on this machine
  local out rc=0
  out=$("$VPY" -m pip --disable-pip-version-check -q "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e "is ignored: it is neither a file nor a directory" -e '^$' || true
  return "$rc"
}
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
