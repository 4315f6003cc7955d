#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): the GPU tests of TuningConfig(prefetch=True) and of every
# TUNED pick that uses it, then compute-sanitizer racecheck of the persistent kernel with prefetch (2 CTAs, so each
# runs several items; hd 64: O tiles, the producer loads an item's first K/V block before its Q tiles).
# Output: $OUT/prefetch_tests_log.txt (results/gpu_tests_fa3_prefetch_H200_<date>.txt, fa3_racecheck_prefetch_...).
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out prefetch_tests_log.txt
step tests 330 3 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k prefetch
export PATH=$PATH:/usr/local/cuda/bin
step race 110 4 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small \
  --schedule persistent --num-ctas 2 --prefetch
step race_causal 110 4 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small \
  --causal --schedule persistent --num-ctas 2 --prefetch
