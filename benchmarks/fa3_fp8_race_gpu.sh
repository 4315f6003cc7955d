#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): compute-sanitizer racecheck of the FP8 forward
# (fp8_config's P-in-registers form; main()'s --small: B=1 S=300 H=2) at three head dims, the persistent
# grid on 2 CTAs (several items each) and the grid, then the GPU tests of FILES (default: every test file but
# test_flash_attention.py, whose GPU tests take a call of their own: benchmarks/gpu_tests_gpu.sh).
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
FILES=${FILES:-$(ls tests/test_*.py | grep -v test_flash_attention.py)}
step pytest "${LIMIT:-330}" 6 python3 -m pytest -m gpu $FILES -v -rfEs -p no:cacheprovider --tb=short -n "${WORKERS:-8}" \
  --junitxml="$OUT/gpu_tests_other.xml"
grep -E "passed|failed|RACECHECK|relative error|rc=" "$STEP_LOG" | tail -20
