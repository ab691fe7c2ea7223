#!/usr/bin/env bash
# Set up .venv (if needed), lint, and run the default (CPU) test suite; then the vLLM rollout
# backend's tests (tests/vllm) inside .venv-vllm, made by scripts/setup_vllm_cpu.sh
# (scripts/test_vllm.sh).
# Extra arguments go to the main suite's pytest, e.g.  bash scripts/test.sh -k loss
#
# AREAL_TEST_VLLM=1: the vLLM tests must run (a failed .venv-vllm setup fails the run; the default
# when CI=true); AREAL_TEST_VLLM=0: skip them; unset: run them when .venv-vllm can be set up and no
# extra arguments were given.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
# The tests' processes cache the bytecode they compile (pytest's rewritten test modules, the examples), in
# __pycache__ folders that git ignores, even where PYTHONDONTWRITEBYTECODE is set: otherwise each pytest
# process rewrites and compiles every test module again (about 6 s of collection each).
unset PYTHONDONTWRITEBYTECODE
.venv/bin/ruff check areal_trainer tests scripts examples
want=${AREAL_TEST_VLLM:-}
if [ -z "$want" ]; then
  if [ "${CI:-}" = "true" ]; then want=1; elif [ $# -gt 0 ]; then want=0; else want=auto; fi
fi
rc=0
# The examples' learning checks run once, under portable kernels, in .ci/run (not here as well).
# Two workers (AREAL_TEST_WORKERS=0: none), each test file on one of them: the e2e runs are single
# processes on one thread each, so two of them keep both cores of a small machine busy. The files go to
# the workers longest first (tests/conftest.py, tests/durations.json), so that neither ends alone.
workers=${AREAL_TEST_WORKERS:-2}
.venv/bin/python -m pytest -q -m "not slow and not learning" --durations=15 \
  $([ "$workers" != 0 ] && echo "-n $workers --dist loadfile --no-loadscope-reorder") "$@" || rc=$?
if [ "$want" != 0 ]; then
  AREAL_TEST_VLLM=$want bash scripts/test_vllm.sh || rc=$?
fi
exit "$rc"
