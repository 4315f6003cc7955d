#!/usr/bin/env bash
# The fused decode/verify kernels (pallas_kernels/skinny_linear.py, specjax/fused.py) on one Hopper GPU,
# in one device call of at most 9 minutes, from the repo root:   bash benchmarks/fused_gpu.sh
#   1. GPU tests of the fused kernels
#   2. the kernels' micro-benchmark against XLA (with --tune: other tile configs at M = 1)
#   3. AR decode ms/token, SmolLM2 shape and Llama-3-8B shape, SPECJAX_FUSED=1 (_fused) and
#      SPECJAX_FUSED=0 (_nofused: the XLA matmuls, the default), one process each, same call
#   4. a profile of the SmolLM2-shape B=1 decode step with the fused path (kernels per step)
# All logs go to $OUT/fused_gpu_log.txt (results files are copied to $OUT by the scripts).
set -uo pipefail
source benchmarks/device_lib.sh  # install_whl, step
install_whl                      # gguf (carried wheel)
export PYTHONPATH=.:benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
OUT=${OUT:-/tmp/fused_out}
mkdir -p "$OUT"
STEP_LOG=$OUT/fused_gpu_log.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$STEP_LOG"

step gpu_tests 150 8 python3 -m pytest -m gpu tests/test_fused.py -q -rfEs \
  -p no:cacheprovider
step kernel_bench 120 30 python3 pallas_kernels/skinny_linear.py --tune
step bench_fused 150 6 env SPECJAX_FUSED=1 python3 benchmarks/bench_decode.py --models smollm-shape,8b --tag _fused
step bench_nofused 150 6 env SPECJAX_FUSED=0 python3 benchmarks/bench_decode.py --models smollm-shape,8b \
  --tag _nofused
step profile 60 25 env SPECJAX_FUSED=1 python3 benchmarks/profile_decode.py --model smollm-shape
