#!/usr/bin/env bash
# One-command GPU check (about 5 minutes on one GPU, no network): GRPO steps of a Qwen2.5-1.5B-shaped
# model with random weights through the real trainer, synchronous and asynchronous (eta = 2; set
# GPU_CHECK_ETAS); writes gpu_check.json (tokens/s, step time, peak memory, update MFU per setting,
# async/sync steps-per-second ratio, shared vs unshared prefixes) and exits non-zero on any error;
# GPU_CHECK_LORA=1 trains LoRA adapters instead of the whole model; GPU_CHECK_BACKEND=vllm:d1p1t1 samples on an
# inference server (GPU_CHECK_WEIGHT_UPDATE=xccl pushes weights by NCCL instead of disk).
#
# The GPU machine has torch and transformers but not hydra-core/omegaconf/antlr4: put their wheels
# in .gpu_wheels/ (bash scripts/gpu_check.sh --fetch-wheels, on a machine with network) and carry it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch-wheels" ]; then
  python3 -m pip download -q --no-deps -d .gpu_wheels "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" \
    "antlr4-python3-runtime==4.9.3" "math-verify>=0.7" "latex2sympy2_extended" "tqdm" "matplotlib" 2>&1 | tail -2
  ls .gpu_wheels
  exit 0
fi
PY=${PYTHON:-python3}
if ! "$PY" -c "import hydra, omegaconf" 2>/dev/null; then
  [ -d .gpu_wheels ] || { echo "hydra-core/omegaconf missing and no .gpu_wheels/ to install them from" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --find-links .gpu_wheels hydra-core omegaconf antlr4-python3-runtime
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SHAPE=${GPU_CHECK_SHAPE:-qwen2.5-1.5b}
STEPS=${GPU_CHECK_STEPS:-4}
timeout "${GPU_CHECK_TIMEOUT:-540}" "$PY" scripts/gpu_check.py --shape "$SHAPE" --steps "$STEPS" \
  --etas "${GPU_CHECK_ETAS:-0,2}" --out "${GPU_CHECK_OUT:-gpu_check.json}" ${GPU_CHECK_LORA:+--lora} \
  --backend "${GPU_CHECK_BACKEND:-hf}" --weight-update-mode "${GPU_CHECK_WEIGHT_UPDATE:-disk}"
