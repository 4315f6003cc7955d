#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (gguf, pytest-xdist,
# execnet):
#   bash benchmarks/fa3_lazy_check_gpu.sh
# v26, after fa3_lazy_table_gpu.sh: the FA3 table once more (on whichever H100 the call gets), then the GPU tests that
# the TUNED change touches: every TUNED config with lazy_rescale against the float32 reference (fp16 too), the hd 128 /
# 256 static masks against their k_end arrays bit for bit, the model's dispatch.
# Log: $OUT/fa3_lazy_check_log.txt; table fa3_<device>_<date>${TAG}.{json,md} into $OUT.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3lazyc_out fa3_lazy_check_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step table "${TABLE_S:-240}" 80 python3 benchmarks/bench_fa3.py --rounds 4 --tag "${TAG:-_h100v26c}" --out "$OUT"
step gpu_tests "${TESTS_S:-240}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 8 -k "${TESTS_K:-lazy or static_masks and (hd128 or hd256) or dispatch}"
true
