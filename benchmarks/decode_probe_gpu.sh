#!/usr/bin/env bash
# One device call (<= 10 min) for the decode-step probes, from the repo root:
#   bash benchmarks/decode_probe_gpu.sh
#   1. GPU tests of the decode kernel filtered by TESTS_K (default "last": the combine="last" configs)
#   2. decode_variants_probe.py over VARIANTS (SmolLM2 shape, B in BATCHES), one process
#   3. profile_decode.py --timeline (the default config): kernels of one layer in order
#   4. the probe's "default" variant again under each XLA_FLAGS value in XLA_VARIANTS ("|"-separated)
# All logs go to one file, $OUT/decode_probe_log.txt (step NAME ... with STEP_LOG).
set -uo pipefail
export PYTHONPATH=.:benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
OUT=${OUT:-/tmp/decode_probe_out}
mkdir -p "$OUT"
export STEP_LOG=$OUT/decode_probe_log.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$STEP_LOG"
source benchmarks/device_lib.sh  # step, install_whl
install_whl
[ -n "${TESTS_K-last}" ] && step gpu_tests 170 12 python3 -m pytest -m gpu tests/test_decode_attention.py -q -rfEs \
  -p no:cacheprovider -k "${TESTS_K-last}" --tb=short
step variants "${VARIANTS_S:-260}" 14 python3 benchmarks/decode_variants_probe.py ${VARIANTS:-default combine=last} \
  --batches "${BATCHES:-1}"
[ -z "${SKIP_PROFILE:-}" ] && step profile 90 3 python3 benchmarks/profile_decode.py --timeline 40 \
  && cp benchmarks/results/profile_smollm-shape_B1.txt "$OUT/" 2>/dev/null
IFS='|' read -ra XV <<< "${XLA_VARIANTS:-}"
for x in "${XV[@]}"; do
  step "xla" 80 4 env XLA_FLAGS="$x" python3 benchmarks/decode_variants_probe.py default
done
true
