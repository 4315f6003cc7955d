#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): hd 256's one-stage forms with turns (alternate_gemms) against
# each row's default and cuDNN on more rows, in two processes with the configs in opposite orders (order-bias check).
# Output: $OUT/turns2_log.txt (results/fa3_turns_probe_H200_2026-11-29_rows.txt).
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out turns2_log.txt
R=256:1024:n,256:4096:n,256:8192:n,256:16384:n,256:2048:c,256:8192:c,256:16384:c
step probe1 250 0 python3 benchmarks/fa3_configs_probe.py $R default,128/1/G/a1,128/1/P/a1,128/1/B/a1 --new-only
step probe2 250 0 python3 benchmarks/fa3_configs_probe.py $R 128/1/B/a1,128/1/P/a1,128/1/G/a1,default --new-only
grep -E "TFLOPS|rc=" "$STEP_LOG"
