#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl and benchmarks/_fa_head.py = the flash_attention.py of commit
# 6abb3b8): the rows whose TUNED picks do not use prefetch, this tree's kernel (its restructured item loop without
# prefetch) against 6abb3b8's in one process, both orders. Output: $OUT/prefetch_check_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out prefetch_check_log.txt
R=256:512:n,256:512:c,256:4096:c,256:16384:n,128:1024:n
step check1 90 0 python3 benchmarks/fa3_configs_probe.py $R default
step check2 90 0 python3 benchmarks/fa3_configs_probe.py $R default --head-first
grep -E "TFLOPS|rc=" "$STEP_LOG"
