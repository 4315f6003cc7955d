#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): TuningConfig(prefetch_row=False), the next item's key range
# loaded ahead without its k_end row, on the persistent forms with overlap (pallas_kernels/NOTES.md v15): its GPU
# tests, a racecheck (2 CTAs, overlap), then a probe against the default and full prefetch on the rows that use
# those forms. Output: $OUT/bounds_log.txt. Runs at commit 04d9639 (the option was reverted after it: NOTES v15).
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out bounds_log.txt
step tests 150 4 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k bounds
step probe128 100 16 python3 benchmarks/fa3_configs_probe.py 128:512:n,128:1024:n,128:2048:n,128:4096:n \
  default,128/2/P+O/f1/r0,128/2/P+O/f1 --new-only
step probe256 100 16 python3 benchmarks/fa3_configs_probe.py 256:512:n,256:1024:n,256:2048:n,256:1024:c \
  default,64/2/P+O/s1/f1/r0,64/2/P+O/s1/f1 --new-only
export PATH=$PATH:/usr/local/cuda/bin
step race 110 4 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small \
  --schedule persistent --num-ctas 2 --overlap --prefetch-bounds
