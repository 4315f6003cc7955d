#!/usr/bin/env bash
# One device call, from the repo root, carrying .whl: the static masks' overlap tests that failed in
# fa3_static_gpu.sh's call (their messages), the probe of "none"'s step counts (fa3_static_probe.py), then the
# rest of the static-mask GPU tests. Log: $OUT/fa3_static2_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3static2_out fa3_static2_log.txt
t="python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs -p no:cacheprovider --tb=short"
step overlap_tests 90 40 $t -x -k "static_masks and persistent+overlap-"
step probe 240 14 python3 benchmarks/fa3_static_probe.py
step rest_tests "${REST_S:-200}" 12 $t -k "static_masks and not persistent+overlap-"
true
