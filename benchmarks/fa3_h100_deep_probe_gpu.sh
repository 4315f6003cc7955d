#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl:
#   bash benchmarks/fa3_h100_deep_probe_gpu.sh
# After v24's picks (three consumers with a 3-deep ring gained 5 % at hd 64 non-causal 16k): the same forms, balanced,
# at hd 64 causal 8k / 16k, and a 3-deep ring of 128-key blocks against the 192-key grid pick at hd 128 non-causal
# 8k / 16k (the H100 target row). Each row's default timed first and again last. Log: $OUT/fa3_h100_deep_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3deep_out fa3_h100_deep_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
P="python3 benchmarks/fa3_configs_probe.py"
step hd64c 70 20 $P 64:8192:c,64:16384:c default,128/2/B/c3/f1,128/3/B/c3/f1,default/n132 --new-only
step hd128n 70 20 $P 128:8192:n,128:16384:n default,128/3/G,128/3/P,default/n132 --new-only
true
