#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (pytest-xdist, execnet):
#   bash benchmarks/fa3_fp8_final_gpu.sh
# NOTES v21: the FP8 forward at its tuned fp8_config(hd, S, causal) (P in registers, balanced persistent grid): the
# accumulator probe's exact-input check, the 24 GPU tests (-k gpu_fp8), then the FP8 table
# (bench_fa3.py --fp8: 36 rows, cuDNN and the bf16 kernel on the same values beside). Log:
# $OUT/fa3_fp8_final_log.txt; the table: $OUT/fa3_*_fp8.{json,md}.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3fp8final_out fa3_fp8_final_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step mma 60 14 python3 benchmarks/fp8_mma_probe.py
step gpu_tests 200 30 python3 -m pytest -m gpu tests/test_flash_attention.py -v -rfEs -p no:cacheprovider \
  --tb=short -n 8 -k gpu_fp8
step bench 200 50 python3 benchmarks/bench_fa3.py --fp8 --tag ${TAG:-_fp8} --out "$OUT"
true
