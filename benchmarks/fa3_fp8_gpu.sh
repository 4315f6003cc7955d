#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf, pytest-xdist, execnet):
#   bash benchmarks/fa3_fp8_gpu.sh
# NOTES v20 / v21: the float8_e4m3fn forward's first GPU call (session 36: results/fa3_fp8_first_H200_2026-12-02.txt,
# with v20's 48 tests; the tests and fp8_config have changed since, fa3_fp8_final_gpu.sh is the current call): its GPU tests,
# then TFLOPS of fp8_config and a few other block shapes on the stretch row (hd 256 16k, >= 1.0 PFLOPS)
# and the other 16k rows, cuDNN (bfloat16, same values) beside, ptxas spills counted; then the bf16 defaults on
# the same rows in a second process. TFLOPS include the XLA transpose of V before the kernel. Log:
# $OUT/fa3_fp8_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3fp8_out fa3_fp8_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gpu_tests 200 20 python3 -m pytest -m gpu tests/test_flash_attention.py -v -rfEs -p no:cacheprovider \
  --tb=short -n 8 -k gpu_fp8
ROWS=256:16384:n,256:16384:c,128:16384:n,64:16384:n,256:2048:n,128:2048:n
MOSAIC_GPU_DUMP_PTXAS=1 step probe_fp8 230 0 python3 benchmarks/fa3_configs_probe.py $ROWS \
  default,default/p1,64/2/P,64/2/P/p1,128/1/G/a1,128/2/G,256/2/P,256/2/P/p1 --dtype float8_e4m3fn
step probe_bf16 120 0 python3 benchmarks/fa3_configs_probe.py $ROWS default
grep -E "passed|failed|TFLOPS|rc=|skip" "$STEP_LOG" | grep -v "^ptxas warning"
grep "bytes spill stores" "$STEP_LOG" | grep -v " 0 bytes spill stores" | sort | uniq -c | head
true
