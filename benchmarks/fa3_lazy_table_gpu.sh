#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (gguf, pytest-xdist,
# execnet):
#   TAG2=_h100v26b bash benchmarks/fa3_lazy_table_gpu.sh            # v26's first call: two tables, TUNED's GPU tests
#   TAG=_h100v26c TABLE_S=240 TESTS_S=240 TESTS_K="lazy or static_masks and (hd128 or hd256) or dispatch" \
#     bash benchmarks/fa3_lazy_table_gpu.sh                         # the second (then a script of its own,
#                                                                   # fa3_lazy_check_gpu.sh, log fa3_lazy_check_log.txt)
# v26: the 16-bit FA3 table with lazy_rescale in TUNED (hd 128 non-causal 1k-4k, causal from 2k, every hd 256
# causal row; fa3_lazy_probe_gpu.sh's H100 probe), 4 rounds, cuDNN and attention_mgpu in the same process, then GPU
# tests (default: every TUNED config against the float32 reference, all mask modes as k_end arrays), then with TAG2 a
# second table.
# Log: $OUT/fa3_lazy_table_log.txt; tables fa3_<device>_<date>${TAG}.{json,md} (and ${TAG2}) into $OUT.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3lazyt_out fa3_lazy_table_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step table "${TABLE_S:-290}" 80 python3 benchmarks/bench_fa3.py --rounds 4 --tag "${TAG:-_h100v26}" --out "$OUT"
step gpu_tests "${TESTS_S:-150}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 8 -k "${TESTS_K:-tuned_configs}"
[ -n "${TAG2:-}" ] && step table2 "${TABLE_S:-290}" 80 python3 benchmarks/bench_fa3.py --rounds 4 --tag "$TAG2" --out "$OUT"
true
