#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (pytest-xdist etc.):
#   bash benchmarks/fa3_balanced_probe_gpu.sh
# After v23 (the balanced order beat the plain persistent one by 1-13 % at hd 256 non-causal up to 2k keys, where all
# items are equal and the two orders differ only in which CTA takes which item of a round): the balanced order on the
# other rows whose pick is the plain persistent schedule or the grid and that lead cuDNN by <= 3 % (hd 256 non-causal
# 4k / 8k, hd 128 non-causal, hd 64 non-causal up to 4k and causal up to 2k), each row's default timed first and again
# last (/n132: the same config under another label). Log: $OUT/fa3_balanced_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3balanced_out fa3_balanced_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
P="python3 benchmarks/fa3_configs_probe.py"
step hd256n 90 20 $P 256:4096:n,256:8192:n default,128/1/B/a1,128/1/P/a1,default/n132 --new-only
step hd128n 130 30 $P 128:1024:n,128:2048:n,128:4096:n default,128/2/B+O,128/2/B,default/n132 --new-only
step hd128nl 90 20 $P 128:8192:n,128:16384:n default,192/2/B,128/2/B+O,default/n132 --new-only
step hd64n 130 30 $P 64:512:n,64:1024:n,64:2048:n,64:4096:n default,256/2/B/f1,256/2/B/f1/m0,default/n132 --new-only
step hd64c 90 20 $P 64:512:c,64:1024:c,64:2048:c default,128/2/B/f1,256/2/B/f1,default/n132 --new-only
true
