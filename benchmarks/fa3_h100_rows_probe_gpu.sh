#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl:
#   bash benchmarks/fa3_h100_rows_probe_gpu.sh
# After fa3_balanced_probe_gpu.sh (the balanced order helped nowhere else): the picks TUNED took from H200 probes
# against their neighbours on an H100, at the rows the v23 H100 tables had <= 1.05x cuDNN and a neighbour to try:
# hd 64 non-causal 16k (the 8k pick, three consumers, there), hd 64 causal 1k / 2k (each other's block), hd 128
# causal 8k, hd 256 causal 4k / 8k (the one-stage forms) and hd 256 non-causal 16k. Each row's default timed first
# and again last (/n132: the same config under another label). Log: $OUT/fa3_h100_rows_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3rows_out fa3_h100_rows_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
P="python3 benchmarks/fa3_configs_probe.py"
step hd64n 90 20 $P 64:16384:n,64:8192:n default,128/2/P/c3/f1/m0,128/2/P/c3/m0,128/3/P/c3/m0,256/2/P/f1/m0,default/n132 --new-only
step hd64c 80 20 $P 64:1024:c,64:2048:c default,128/2/P/f1,256/2/P/f1,192/2/P/f1,256/2/P,default/n132 --new-only
step hd128c 60 20 $P 128:8192:c default,192/2/G,192/2/B,128/2/B/f1,128/2/B+O,default/n132 --new-only
step hd256c 90 20 $P 256:4096:c,256:8192:c default,128/1/G/a1,128/1/B/a1,64/2/B,64/2/B+O/s1,default/n132 --new-only
step hd256n 60 20 $P 256:16384:n default,128/1/G/a1,128/1/P/a1/s1,128/1/P/a1,default/n132 --new-only
true
