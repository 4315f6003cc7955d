#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (pytest-xdist, execnet):
#   bash benchmarks/fa3_split_diag_gpu.sh
# v25's split_tail after its first probe (results/fa3_split_probe_H100_2026-12-05_log.txt: slower on most rows, by
# ~10 us at hd 64 / 128 and ~40 us at hd 256): the GPU tests of the split forms (4 workers: at 8 the float32
# references ran out of memory), then fa3_split_diag.py (the kernel's time with and without the merge, XLA's HLO
# around it), then ptxas' report for the pick and its split form at hd 128 2k (spills). Its run:
# results/fa3_split_diag_H100_2026-12-05_log.txt. Log: $OUT/fa3_split_diag_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3splitdiag_out fa3_split_diag_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gpu_tests "${TESTS_S:-220}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 4 -k split_tail
step diag "${DIAG_S:-220}" 80 python3 benchmarks/fa3_split_diag.py \
  256:512:n,128:1024:n,256:2048:n,128:2048:n,64:4096:n,64:2048:n --iters 40
MOSAIC_GPU_DUMP_PTXAS=1 step ptxas 80 0 python3 benchmarks/fa3_configs_probe.py 128:2048:n default,default/t1 \
  --new-only --iters 5
grep -i -E "spill|registers|TFLOPS" /tmp/step_ptxas.txt | sort | uniq -c | head -30
true
