#!/usr/bin/env bash
# The vLLM rollout backend's tests (tests/vllm) inside .venv-vllm, set up first by
# scripts/setup_vllm_cpu.sh (seconds when it exists). Run by scripts/test.sh after the main suite, and
# by .ci/run beside the examples' learning checks.
#
# AREAL_TEST_VLLM=1 (the default when CI=true): a failed .venv-vllm setup fails the run; otherwise
# it is a warning and the tests are not run. AREAL_TEST_VLLM=0 skips them.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
want=${AREAL_TEST_VLLM:-}
if [ -z "$want" ] && [ "${CI:-}" = "true" ]; then want=1; fi
if [ "$want" = 0 ]; then echo "tests/vllm skipped (AREAL_TEST_VLLM=0)"; exit 0; fi
if bash scripts/setup_vllm_cpu.sh; then
  # One thread: vLLM's in-process CPU engine slows down badly when OpenMP threads compete for cores.
  OMP_NUM_THREADS=1 exec .venv-vllm/bin/python -m pytest -q -m "not slow" --durations=5 -rs tests/vllm
elif [ "$want" = 1 ]; then
  echo "error: scripts/setup_vllm_cpu.sh failed, so tests/vllm cannot run (AREAL_TEST_VLLM=0 skips them)" >&2
  exit 1
else
  echo "warning: scripts/setup_vllm_cpu.sh failed; tests/vllm were not run" >&2
fi
