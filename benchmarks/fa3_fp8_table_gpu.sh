#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (gguf, pytest-xdist,
# execnet):
#   bash benchmarks/fa3_fp8_table_gpu.sh      # v28 (pallas_kernels/NOTES.md)
# The FP8 GPU tests (-k "fp8_lazy or gpu_fp8_matches"; fp8_config takes lazy_rescale at hd 256 non-causal); only if
# every one passed, the FP8 table (bench_fa3.py --fp8, rewritten after each row) in the time left.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3fp8t_out fa3_fp8_table_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step fp8_tests "${TESTS_S:-210}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 8 -k "fp8_lazy or gpu_fp8_matches"
tail -3 /tmp/step_fp8_tests.txt | grep -q -E "^[0-9]+ passed" && ! tail -3 /tmp/step_fp8_tests.txt | grep -q -E \
  "failed|error" || { echo "the FP8 tests did not all pass: no table" | tee -a "$STEP_LOG"; exit 3; }
step fp8_table $((570 - SECONDS)) 45 python3 benchmarks/bench_fa3.py --fp8 --tag _v28fp8 --out "$OUT"
true
