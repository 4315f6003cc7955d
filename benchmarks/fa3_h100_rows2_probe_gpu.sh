#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl:
#   bash benchmarks/fa3_h100_rows2_probe_gpu.sh
# After fa3_h100_rows_probe_gpu.sh (three consumers +5 % at hd 64 non-causal 16k, the grid +1-4 % at hd 256 non-causal
# 16k): three consumers and the static mask at hd 64 non-causal up to 4k and at 16k, and the grid / persistent forms
# at hd 128 non-causal 4k / 8k (1.00-1.01x cuDNN in the v23 tables). Each row's default timed first and again last.
# Log: $OUT/fa3_h100_rows2_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3rows2_out fa3_h100_rows2_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
P="python3 benchmarks/fa3_configs_probe.py"
step hd64n 130 30 $P 64:512:n,64:1024:n,64:2048:n,64:4096:n \
  default,128/2/P/c3/f1/m0,128/2/P/c3/f1,256/2/P/f1,256/2/B/f1,default/n132 --new-only
step hd64n16k 70 20 $P 64:16384:n default,128/2/P/c3/f1/m0,128/2/P/c3/f1,128/2/B/c3/f1,128/3/P/c3/f1/m0,default/n132 --new-only
step hd128n 80 20 $P 128:4096:n,128:8192:n default,128/2/G+O,128/2/P,192/2/P,default/n132 --new-only
true
