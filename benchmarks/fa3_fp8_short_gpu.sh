#!/usr/bin/env bash
# One device call: FP8 block shapes on the short rows (512 / 1k), where fp8_config (tuned at 16k) ran below the
# bf16 kernel (results/fa3_h200_2026-12-02_fp8.md). NOTES v21.
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/o fa3_fp8_short_log.txt
ROWS=64:512:n,64:512:c,64:1024:c,128:512:n,128:512:c,128:1024:c,256:512:n,256:512:c,256:1024:c,256:1024:n
step short 300 0 python3 benchmarks/fa3_configs_probe.py $ROWS \
  default,128/2/B/p1,128/3/B/p1,64/2/B/p1,64/3/B/p1,128/1/B/a1/p1,128/2/G/p1 --dtype float8_e4m3fn
grep -E "TFLOPS|rc=" "$STEP_LOG"
