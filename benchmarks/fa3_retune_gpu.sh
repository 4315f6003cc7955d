#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf):
#   bash benchmarks/fa3_retune_gpu.sh
# TUNED was fitted with the mask as k_end arrays; the static form (v17) gained more on some configs than on others
# (hd 256 non-causal 4k: the one-stage grid with turns +2.4 %, the 2k pick +0.8 %). So the rows nearest cuDNN are
# probed again in the static form, each row's default against its alternatives, one process per group, bf16, cuDNN
# beside. Log: $OUT/fa3_retune_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3retune_out fa3_retune_log.txt
P="python3 benchmarks/fa3_configs_probe.py"
step hd256n 120 40 $P 256:512:n,256:1024:n,256:2048:n \
  default,128/1/G/a1,128/1/P/s1/a1,64/2/G+O,64/2/P+O --new-only
step hd128n 150 40 $P 128:512:n,128:1024:n,128:2048:n,128:4096:n,128:8192:n \
  default,128/2/P,128/2/P/f1,192/2/G,128/2/G+O --new-only
step hd64n 60 20 $P 64:512:n,64:1024:n default,256/2/P/f1,128/2/P/f1 --new-only
true
