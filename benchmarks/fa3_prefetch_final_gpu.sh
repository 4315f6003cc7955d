#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl), right after fa3_prefetch_tests_gpu.sh on the same machine:
# racecheck of the persistent kernel with prefetch (2 CTAs; non-causal and causal), then the FA3 table.
# Output: $OUT/prefetch_final_log.txt and the table's fa3_<device>_<date>_prefetch.{json,md}.
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out prefetch_final_log.txt
export PATH=$PATH:/usr/local/cuda/bin
step race 110 4 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small \
  --schedule persistent --num-ctas 2 --prefetch
step race_causal 110 4 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small \
  --causal --schedule persistent --num-ctas 2 --prefetch
step table 300 80 python3 benchmarks/bench_fa3.py --tag _prefetch --out "$OUT"
