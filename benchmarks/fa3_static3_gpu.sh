#!/usr/bin/env bash
# One device call, from the repo root, carrying .whl: the static masks' GPU tests of the overlap forms (O bit for
# bit, LSE to 1 ulp against the k_end array), then fa3_static_probe.py on the 18 bf16 non-causal rows.
# Log: $OUT/fa3_static3_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3static3_out fa3_static3_log.txt
t="python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs -p no:cacheprovider --tb=short"
step probe 200 24 python3 benchmarks/fa3_static_probe.py
step overlap_tests "${TESTS_S:-150}" 30 $t -k "static_masks and overlap"
true
