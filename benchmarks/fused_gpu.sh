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
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1   # gguf (carried wheel)
export PYTHONPATH=.:benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
OUT=${OUT:-/tmp/fused_out}
mkdir -p "$OUT"
LOG=$OUT/fused_gpu_log.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOG"

step() {  # step NAME SECONDS TAIL_LINES CMD...
  local name=$1 limit=$2 lines=$3; shift 3
  local t0=$SECONDS
  echo "== $name: $*" >> "$LOG"
  timeout "$limit" "$@" > /tmp/step.txt 2>&1
  local rc=$?
  grep -v -i "deprecat" /tmp/step.txt >> "$LOG"
  echo "== $name: rc=$rc, $((SECONDS - t0)) s (rc 124 = timed out after ${limit} s)" | tee -a "$LOG"
  grep -v -i "deprecat" /tmp/step.txt | tail -n "$lines"
}

step gpu_tests 150 8 python3 -m pytest -m gpu tests/test_fused.py -q -rfEs \
  -p no:cacheprovider
step kernel_bench 120 30 python3 pallas_kernels/skinny_linear.py --tune
step bench_fused 150 6 env SPECJAX_FUSED=1 python3 benchmarks/bench_decode.py --models smollm-shape,8b --tag _fused
step bench_nofused 150 6 env SPECJAX_FUSED=0 python3 benchmarks/bench_decode.py --models smollm-shape,8b \
  --tag _nofused
step profile 60 25 env SPECJAX_FUSED=1 python3 benchmarks/profile_decode.py --model smollm-shape
