#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf, pytest-xdist, execnet wheels) and
# benchmarks/_fa_head.py (`git show 88a879b:pallas_kernels/flash_attention.py > benchmarks/_fa_head.py`):
#   bash benchmarks/fa3_produce_gpu.sh
# The grid forward's producer folded into `_produce` (shared with the backward kernels): each grid pick of TUNED
# against the previous kernel in one process (static masks, bf16, cuDNN beside), then the forward's grid-schedule
# GPU tests and the backward kernels' GPU tests (pytest-xdist, 4 workers sharing the GPU, no preallocation).
# Log: $OUT/fa3_produce_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3produce_out fa3_produce_log.txt
step probe 200 40 python3 benchmarks/fa3_configs_probe.py \
  128:8192:n,128:16384:n,256:4096:n,256:8192:n,64:16384:c,128:8192:c,128:16384:c,256:16384:c default
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gpu_tests 300 25 python3 -m pytest -m gpu tests/test_flash_attention.py tests/test_flash_attention_bwd.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 4 -k "${TESTS_K:-(gpu_matches_float32_reference and grid) or bwd}"
true
