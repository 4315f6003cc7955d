#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf: specjax imports it):
#   bash benchmarks/fa3_rowsum_gpu.sh
# NOTES v20: P's row sums on the tensor cores (`TuningConfig(rowsum_mma=True)`: a wgmma of the 16-bit P against
# a one-hot [block_kv, 8] tile, issued with PV) instead of one FADD per score. The exp_poly probe found the hd 64
# softmax bound by the FMA pipe's issue, not MUFU. Each row's non-overlap default against the same config with
# /r1, the default again last (/r0: the order-bias control); ptxas spills counted. Static masks, bf16, cuDNN
# beside, one process per head dim. Log: $OUT/fa3_rowsum_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3rowsum_out fa3_rowsum_log.txt
ROWS64=64:512:n,64:1024:n,64:2048:n,64:4096:n,64:8192:n,64:16384:n,64:512:c,64:1024:c,64:2048:c,64:4096:c,64:8192:c,64:16384:c
MOSAIC_GPU_DUMP_PTXAS=1 step probe_hd64 200 0 python3 benchmarks/fa3_configs_probe.py $ROWS64 default,default/r1,default/r0
MOSAIC_GPU_DUMP_PTXAS=1 step probe_hd128 150 0 python3 benchmarks/fa3_configs_probe.py \
  128:512:c,128:2048:c,128:8192:c,128:16384:c,128:16384:n default,default/r1,default/r0
MOSAIC_GPU_DUMP_PTXAS=1 step probe_hd256 100 0 python3 benchmarks/fa3_configs_probe.py \
  256:512:c,256:16384:c,256:4096:n default,default/r1,default/r0
grep -E "TFLOPS|rc=|failed|skip" "$STEP_LOG"
grep -c " 0 bytes spill stores" "$STEP_LOG"; grep "bytes spill stores" "$STEP_LOG" | grep -v " 0 bytes spill stores" | sort | uniq -c | head
true
