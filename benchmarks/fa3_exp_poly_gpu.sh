#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf: specjax imports it):
#   bash benchmarks/fa3_exp_poly_gpu.sh
# NOTES v20: FA4's exp emulation on Hopper. hd 64 runs 2x the exp2 of hd 128 per FLOP; MUFU does 16 per clock
# per SM, the FMA pipe 128. `TuningConfig(exp_poly=N)` computes the last N key columns of each block with
# `exp2_poly` (degree-3 polynomial + exponent bits) on the FMA / integer pipes. Each hd 64 row's default against
# the same config with N = 16 .. 64 (default/e0 again last: the order-bias control), ptxas spills counted;
# two hd 128 rows as a check where MUFU is not the limit. Static masks, bf16, cuDNN beside, one process per
# head dim. Log: $OUT/fa3_exp_poly_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3exppoly_out fa3_exp_poly_log.txt
ROWS64=64:512:n,64:1024:n,64:2048:n,64:4096:n,64:8192:n,64:16384:n,64:512:c,64:1024:c,64:2048:c,64:4096:c,64:8192:c,64:16384:c
MOSAIC_GPU_DUMP_PTXAS=1 step probe_hd64 330 0 python3 benchmarks/fa3_configs_probe.py $ROWS64 \
  default,default/e16,default/e32,default/e48,default/e64,default/e0
MOSAIC_GPU_DUMP_PTXAS=1 step probe_hd128 120 0 python3 benchmarks/fa3_configs_probe.py 128:512:c,128:16384:n \
  default,default/e16,default/e32,default/e0
grep -E "TFLOPS|rc=|failed|skip" "$STEP_LOG"
grep -c " 0 bytes spill stores" "$STEP_LOG"; grep "bytes spill stores" "$STEP_LOG" | grep -v " 0 bytes spill stores" | sort | uniq -c | head
true
