#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf; with XDIST also pytest-xdist and execnet
# wheels) and, for the probe, benchmarks/_fa_head.py (the previous kernel:
# `git show <rev>:pallas_kernels/flash_attention.py > benchmarks/_fa_head.py`):
#   bash benchmarks/fa3_late_gpu.sh                              # NOTES v18's call (at commit 1b75fa8)
#   PROBE=0 XDIST=4 TESTS_K="..." RACE_ARGS="..." bash benchmarks/fa3_late_gpu.sh   # tests and racecheck alone
# NOTES v18: the last consumer's late Q release (spare_q) and the register split (TuningConfig.registers), probed in
# one process per group against the previous kernel (static masks, as the table times them), then GPU tests, then
# compute-sanitizer racecheck of one small kernel. Both changes measured no gain and were reverted after 1b75fa8;
# the probe's /r240_24 labels need that commit's TuningConfig.registers. Log: $OUT/fa3_late_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3late_out fa3_late_log.txt
P="python3 benchmarks/fa3_configs_probe.py"
if [ "${PROBE:-1}" = 1 ]; then
  step probe_hd256n 150 40 $P 256:512:n,256:1024:n,256:2048:n default,64/2/P+O/s1/r240_24
  step probe_hd256c 100 30 $P 256:512:c,256:1024:c default,64/2/P/s1/r240_24,64/2/P+O/s1/r240_24
  step probe_hd64c 120 30 $P 64:512:c,64:1024:c,64:2048:c default,128/2/P/f1/r240_24,256/2/P/f1/r240_24 --new-only
fi
# XDIST=N: N pytest workers sharing the GPU (compilation is most of a GPU test's time), without preallocation
xdist=()
[ -n "${XDIST:-}" ] && { export XLA_PYTHON_CLIENT_PREALLOCATE=false; xdist=(-n "$XDIST"); }
step gpu_tests "${TESTS_S:-200}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short "${xdist[@]}" \
  -k "${TESTS_K:-spare_q_varlen or (static_masks and spare) or static_mask_attention}"
# RACE_ARGS: flash_attention.py main()'s options after --small, one racecheck run per ';'-separated set
IFS=';' read -ra races <<< "${RACE_ARGS:---schedule persistent --num-ctas 2 --spare-q}"
for i in "${!races[@]}"; do
  step "racecheck$i" 120 12 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small ${races[$i]}
done
true
