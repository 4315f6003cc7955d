#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf, pytest-xdist, execnet) and benchmarks/_fa_head.py
# (`git show 4732b44:pallas_kernels/flash_attention.py > benchmarks/_fa_head.py`, the snake anchored at the start):
#   bash benchmarks/fa3_snake_gpu.sh
# NOTES v18: _balanced_order's snake anchored at the end (benchmarks/fa3_waves.py counts hd 256 causal 4k / 8k at
# 1.002x / 1.000x the mean per-CTA work, against 1.031x) on the balanced picks of TUNED, against the previous order
# in one process; and the balanced form, now 1.003x by that count, on the two persistent picks it would even out
# (hd 128 causal 4k, hd 64 causal 8k: 1.031x with their round robin). Static masks, bf16, cuDNN beside. Then the
# balanced GPU tests. Log: $OUT/fa3_snake_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3snake_out fa3_snake_log.txt
step probe 200 40 python3 benchmarks/fa3_configs_probe.py 256:4096:c,256:8192:c,256:16384:n,128:4096:c,64:8192:c \
  default,128/2/B/f1,256/2/B/f1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gpu_tests 120 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs -p no:cacheprovider --tb=short \
  -n 4 -k "${TESTS_K:-balanced and (tuned or static_masks)}"
true
