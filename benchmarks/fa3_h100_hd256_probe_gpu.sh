#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl:
#   bash benchmarks/fa3_h100_hd256_probe_gpu.sh
# After v24's two tables (the rows behind cuDNN: hd 256 non-causal 2k, 0.997-1.000x): narrower KV blocks for the
# balanced form there (80 keys, FA3's hd 256 tile, with two stages; 80 / 112 with one stage and turns) and fewer
# CTAs than SMs. Each row's default timed first and again last. Log: $OUT/fa3_h100_hd256_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3hd256_out fa3_h100_hd256_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step hd256n 100 20 python3 benchmarks/fa3_configs_probe.py 256:1024:n,256:2048:n \
  default,80/2/B,80/2/B/a1,80/1/B/a1,112/1/B/a1,128/1/B/a1/n128,default/n132 --new-only
true
