#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying an older decode_attention.py:
#   OLD=.carry/old_da/decode_attention.py TESTS_K="t1_equals or capacity" bash benchmarks/combine_gpu.sh
# The decode/verify attention call of this tree against OLD's (combine_probe.py, one process), the EAGLE-3
# cycles of tree_cost_probe.py with this tree's file and then with OLD's copied over it (restored after), and
# the decode-attention GPU tests selected by TESTS_K. Everything goes to $OUT/combine_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/combine_out combine_log.txt
step probe 200 40 python3 benchmarks/combine_probe.py --old "$OLD"
step cycles_new 150 8 python3 benchmarks/tree_cost_probe.py --sizes 15,31 --no-rows --cycles eagle3
cp pallas_kernels/decode_attention.py /tmp/new_decode_attention.py && cp "$OLD" pallas_kernels/decode_attention.py
step cycles_old 150 8 python3 benchmarks/tree_cost_probe.py --sizes 15,31 --no-rows --cycles eagle3
cp /tmp/new_decode_attention.py pallas_kernels/decode_attention.py
step gpu_tests "${TESTS_S:-200}" 12 python3 -m pytest -m gpu tests/test_decode_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -k "$TESTS_K"
true
