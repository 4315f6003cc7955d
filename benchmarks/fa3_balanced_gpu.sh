#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf: specjax imports it):
#   bash benchmarks/fa3_balanced_gpu.sh
# NOTES v19: the balanced persistent form with v18's snake (anchored at the end) on the long causal rows whose
# TUNED pick is the grid (one CTA per tile, the hardware's scheduler). Their item counts (2048 / 4096 / 1024) make
# an odd number of full rounds on 132 CTAs, where the snake before v18 left the partial round on the busiest
# CTAs, so the balanced form was last measured there with that defect. Static masks, bf16, cuDNN beside, one
# process. Log: $OUT/fa3_balanced_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3balanced_out fa3_balanced_log.txt
step probe_hd128 150 30 python3 benchmarks/fa3_configs_probe.py 128:8192:c,128:16384:c \
  default,128/2/B,192/2/B,128/2/B/f1,128/2/B+O
step probe_hd64 120 30 python3 benchmarks/fa3_configs_probe.py 64:16384:c default,128/2/B,256/2/B,128/2/B/f1,256/2/B/f1
step probe_hd256 120 30 python3 benchmarks/fa3_configs_probe.py 256:16384:c,256:16384:n default,128/1/B/a1,64/2/B+O,128/1/G/a1
true
