#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl) after hd 256's one-stage + turns picks entered TUNED
# (pallas_kernels/NOTES.md v13):
# 1. GPU tests of the hd 256 TUNED configs and of the one-stage forms with turns (float32 reference, outputs poisoned);
# 2. the FA3 table with the new defaults (bench_fa3.py, tag _turns) into $OUT;
# 3. compute-sanitizer racecheck of the turns order, grid and persistent (2 CTAs, several items each).
#   bash benchmarks/fa3_turns_final_gpu.sh
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out turns_final_log.txt
step tests 170 3 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k "(tuned and hd256) or turns" -p no:cacheprovider
step table 300 3 python3 benchmarks/bench_fa3.py --tag _turns --out $OUT
export PATH=$PATH:/usr/local/cuda/bin
step race_grid 120 3 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small --stages 1 \
  --alternate-gemms --schedule grid
step race_persistent 120 3 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small --stages 1 \
  --alternate-gemms --schedule persistent --num-ctas 2
grep -E "passed|failed|RACECHECK|relative error|rc=" "$STEP_LOG"
