#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl and benchmarks/_fa_head.py (the previous kernel:
# `git show <rev>:pallas_kernels/flash_attention.py > benchmarks/_fa_head.py`):
#   bash benchmarks/fa3_late_gpu.sh
# NOTES v18: the last consumer's late Q release (spare_q) and the register split (TuningConfig.registers), probed in
# one process per group against the previous kernel (static masks, as the table times them), then the GPU tests of
# the spare-Q forms and of the static entry's gradient, then racecheck of a spare-Q persistent kernel with several
# items per CTA. Log: $OUT/fa3_late_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3late_out fa3_late_log.txt
P="python3 benchmarks/fa3_configs_probe.py"
if [ "${PROBE:-1}" = 1 ]; then
  step probe_hd256n 150 40 $P 256:512:n,256:1024:n,256:2048:n default,64/2/P+O/s1/r240_24
  step probe_hd256c 100 30 $P 256:512:c,256:1024:c default,64/2/P/s1/r240_24,64/2/P+O/s1/r240_24
  step probe_hd64c 120 30 $P 64:512:c,64:1024:c,64:2048:c default,128/2/P/f1/r240_24,256/2/P/f1/r240_24 --new-only
fi
step gpu_tests "${TESTS_S:-200}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -k "${TESTS_K:-spare_q_varlen or (static_masks and spare) or static_mask_attention}"
step racecheck 120 12 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small \
  --schedule persistent --num-ctas 2 --spare-q
true
