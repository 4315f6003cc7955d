#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root: the one-launch decoder layer (pallas_kernels/decode_layer.py).
#   bash benchmarks/layer_kernel_gpu.sh            (carry .whl)
# 1. its GPU tests (TESTS_K: a -k filter), 2. the per-layer micro-benchmark (kernel vs XLA reference),
# 3. ROUNDS rounds of alternating processes, SPECJAX_LAYER_KERNEL=1 then 0, each running
#    `decode_variants_probe.py default --busy` (SmolLM2 shape, B=1: ms/token, kernels and GPU-busy us per step).
# Everything goes to $OUT/layer_log.txt.
set -uo pipefail
export PYTHONPATH=.:benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
OUT=${OUT:-/tmp/layer_out}
mkdir -p "$OUT"
export STEP_LOG=$OUT/layer_log.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$STEP_LOG"
source benchmarks/device_lib.sh  # step, install_whl
install_whl
[ -z "${SKIP_TESTS:-}" ] && step gpu_tests "${TESTS_S:-240}" 15 python3 -m pytest -m gpu tests/test_decode_layer.py -q \
  -rfEs -p no:cacheprovider --tb=short --timeout 90 ${TESTS_K:+-k "$TESTS_K"}
step micro 90 6 python3 -m pallas_kernels.decode_layer
for round in $(seq "${ROUNDS:-2}"); do
  for on in 1 0; do
    SPECJAX_LAYER_KERNEL=$on step "layer${on}_r$round" 120 3 python3 benchmarks/decode_variants_probe.py default \
      --repeats "${REPEATS:-5}" --busy
  done
done
true
