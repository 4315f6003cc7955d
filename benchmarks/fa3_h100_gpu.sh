#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (gguf, pytest-xdist,
# execnet):
#   bash benchmarks/fa3_h100_gpu.sh
#   RUN_FP8=0 TAG=_h100v23 TESTS_S=120 TESTS_K="tuned_configs and hd256 or static_masks and 256" \
#     bash benchmarks/fa3_h100_gpu.sh                          # v23's table, as it ran
#   RUN_FP8=0 TAG=_h100v24 TESTS_S=150 TESTS_K="tuned_configs and hd64 or static_masks and hd64" \
#     bash benchmarks/fa3_h100_gpu.sh                          # v24's
#   RUN_FP8=0 TAG=_h100v26 TAG2=_h100v26b TESTS_K=tuned_configs bash benchmarks/fa3_h100_gpu.sh   # v26's first call
#   RUN_FP8=0 TAG=_h100v26c TABLE_S=240 TESTS_S=240 TESTS_K="lazy or static_masks and (hd128 or hd256) or dispatch" \
#     bash benchmarks/fa3_h100_gpu.sh                          # v26's second
#   (v26's two calls ran these steps as fa3_lazy_table_gpu.sh and fa3_lazy_check_gpu.sh, since folded in here; their
#   logs are results/fa3_lazy_{table,check}_H100_2026-12-06_log.txt)
# The FA3 forward with the current TUNED picks on an H100 (first run: v19's picks, fitted on H200s, on the first H100
# lent since 2026-11-28): the 16-bit table (bench_fa3.py, 4 rounds, cuDNN and attention_mgpu in the same process), the
# GPU tests of every TUNED config (float32 reference, static masks against their k_end arrays, the model's dispatch,
# FP8), then (TAG2 set) a second 16-bit table, then the FP8 table.
# Log: $OUT/fa3_h100_log.txt; tables fa3_<device>_<date>${TAG}.{json,md} and ..${TAG}fp8.* into $OUT.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3h100_out fa3_h100_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step table "${TABLE_S:-290}" 80 python3 benchmarks/bench_fa3.py --rounds 4 --tag "${TAG:-_h100}" --out "$OUT"
step gpu_tests "${TESTS_S:-150}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 8 \
  -k "${TESTS_K:-tuned_configs or static_mask or dispatch or gpu_fp8}"
[ -n "${TAG2:-}" ] && step table2 "${TABLE_S:-290}" 80 python3 benchmarks/bench_fa3.py --rounds 4 --tag "$TAG2" --out "$OUT"
[ "${RUN_FP8:-1}" = 1 ] && step fp8_table "${FP8_S:-140}" 40 python3 benchmarks/bench_fa3.py --fp8 --tag "${TAG:-_h100}fp8" --out "$OUT"
true
