#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf: specjax imports it); optionally a GGUF
# part to stage for a later call (STAGE=NN, carry .carry/pNN; benchmarks/device_lib.sh):
#   bash benchmarks/fa3_static_gpu.sh                      # tests + table (fa3_<device>_<date>_static.*)
#   RUN_TESTS=0 TAG=_static2 bash benchmarks/fa3_static_gpu.sh   # the table alone (v17's second table; it ran as
#                                                          # fa3_static4_gpu.sh, commit a6d8b6f)
# The FA3 forward's static masks (flash_attention_fwd(..., causal=...): k_end computed in the kernel): their GPU
# tests (every TUNED config against the float32 reference and, O bit for bit, the same config with the mask's
# k_end array), then the table (bench_fa3.py, 4 rounds) with both forms beside cuDNN and attention_mgpu in the same
# process. Log: $OUT/fa3_static_log.txt; the table fa3_<device>_<date>${TAG}.{json,md} into $OUT.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step, stage_part
probe_setup /tmp/fa3static_out fa3_static_log.txt
if [ "${RUN_TESTS:-1}" = 1 ]; then
  step gpu_tests "${TESTS_S:-200}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
    -p no:cacheprovider --tb=short -k "${TESTS_K:-static_masks or prefetch_varlen or dispatch}"
fi
step table "${TABLE_S:-360}" 80 python3 benchmarks/bench_fa3.py --rounds 4 --tag "${TAG:-_static}" --out "$OUT"
[ -n "${STAGE:-}" ] && stage_part "$STAGE"
true
