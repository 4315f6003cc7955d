#!/usr/bin/env bash
# One device call (<= 10 min) for the decode-step probes, from the repo root:
#   bash benchmarks/decode_probe_gpu.sh
#   1. GPU tests of the decode kernel filtered by TESTS_K (default: all; "" skips them)
#   2. decode_variants_probe.py over VARIANTS (SmolLM2 shape, B in BATCHES, extra PROBE_ARGS), one process
#   3. profile_decode.py --timeline (the default config; SKIP_PROFILE=1 leaves it out): kernels in order
#   4. the probe's "default" variant again under each XLA_FLAGS value in XLA_VARIANTS ("|"-separated)
# All logs go to one file, $OUT/decode_probe_log.txt (step NAME ... with STEP_LOG).
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/decode_probe_out decode_probe_log.txt
[ -n "${TESTS_K-all}" ] && step gpu_tests "${TESTS_S:-170}" 12 python3 -m pytest -m gpu tests/test_decode_attention.py -q -rfEs \
  -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} --tb=short
step variants "${VARIANTS_S:-260}" 14 python3 benchmarks/decode_variants_probe.py ${VARIANTS:-default} \
  --batches "${BATCHES:-1}" ${PROBE_ARGS:-}
[ -z "${SKIP_PROFILE:-}" ] && step profile 90 3 python3 benchmarks/profile_decode.py --timeline 40
IFS='|' read -ra XV <<< "${XLA_VARIANTS:-}"
for x in "${XV[@]}"; do
  step "xla" 80 4 env XLA_FLAGS="$x" python3 benchmarks/decode_variants_probe.py default
done
true
