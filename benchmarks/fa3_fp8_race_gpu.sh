#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): compute-sanitizer racecheck of the FP8 forward
# (fp8_config's P-in-registers form; main()'s --small: B=1 S=300 H=2) at three head dims, the persistent
# grid on 2 CTAs (several items each) and the grid (results/fa3_fp8_racecheck_H200_2026-12-02.txt). Its first run
# (session 38) also ran GPU tests after these steps; that is `FILES=... bash benchmarks/gpu_tests_gpu.sh`.
#   bash benchmarks/fa3_fp8_race_gpu.sh
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out fp8_race_log.txt
export PATH=$PATH:/usr/local/cuda/bin XLA_PYTHON_CLIENT_PREALLOCATE=false
race() { step "race_$1" 150 3 compute-sanitizer --tool racecheck python3 -m pallas_kernels.flash_attention --small --fp8 "${@:2}"; }
race hd64_persistent --head-dim 64 --schedule persistent --num-ctas 2
race hd256_persistent_causal --head-dim 256 --causal --schedule persistent --num-ctas 2
race hd128_grid --head-dim 128 --schedule grid
step checked 120 2 python3 -m pallas_kernels.flash_attention --small --fp8 --head-dim 128 --schedule persistent --num-ctas 2
grep -E "RACECHECK|relative error|rc=" "$STEP_LOG" | tail -20
