#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf: specjax imports it):
#   TAG=_v2 bash benchmarks/fa3_bwd_gpu.sh
# The FA3 backward kernels (pallas_kernels/flash_attention_bwd.py): main() at hd 128 / 64 for the default
# config and a few others (error against the float32 reference, per-kernel CUPTI times, TFLOPS, wall clock),
# the backward table (bench_fa3_bwd.py, also into $OUT), one compute-sanitizer racecheck run, then (RUN_TESTS=1)
# the GPU tests. Everything but the table goes to $OUT/fa3_bwd_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3bwd_out fa3_bwd_log.txt
main="python3 -m pallas_kernels.flash_attention_bwd"
step main128 60 4 $main --seq 4096 --head-dim 128
step main128_s3 40 3 $main --seq 4096 --head-dim 128 --stages-dkv 3
step main128_kv128 40 3 $main --seq 4096 --head-dim 128 --block-kv-dq 128
step main64 40 3 $main --seq 4096 --head-dim 64
step main64_kv128 40 3 $main --seq 4096 --head-dim 64 --block-kv-dq 128
step bench "${BENCH_S:-330}" 45 python3 benchmarks/bench_fa3_bwd.py ${BENCH_ARGS:-} --tag "${TAG:-}"
step race 140 4 compute-sanitizer --tool racecheck $main --small
if [ "${RUN_TESTS:-0}" = 1 ]; then
  step gpu_tests "${TESTS_S:-260}" 25 python3 -m pytest -m gpu tests/test_flash_attention_bwd.py -q -rfEs \
    -p no:cacheprovider --tb=short -k "${TESTS_K:-}"
fi
true
