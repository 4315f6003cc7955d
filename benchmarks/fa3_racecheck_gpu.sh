#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): compute-sanitizer on the FA3 kernels, with controls.
#   bash benchmarks/fa3_racecheck_gpu.sh                       # the controls, then every case below
#   CASES="bwd64 fwd128" TOOL=synccheck bash benchmarks/fa3_racecheck_gpu.sh
# Controls first, races the tool must report: the CUDA C kernel of benchmarks/racecheck_control/race.cu (warp 4
# reads shared memory that warp 0 stores, no __syncthreads), and benchmarks/racecheck_probe.py --race (the same
# race between two Mosaic GPU warpgroups; --tma: the store is a TMA copy, as FA3's producer's).
# Then each case: main()'s --small run (B=1 S=300 H=2; pallas_kernels/flash_attention{,_bwd}.py) with --no-check,
# under `compute-sanitizer --tool $TOOL --kernel-name kns=fa3_`: only the kernels named fa3_fwd / fa3_bwd_dkv /
# fa3_bwd_dq are instrumented, not XLA's own.
# Found on an H100 with compute-sanitizer 2025.3.1 (results/fa3_racecheck_H100_2026-12-07.txt): racecheck reports
# the CUDA C race and neither Mosaic GPU race, so its "0 hazards" on the FA3 kernels is no evidence; the race
# check that sees them is the GPU interpreter's (tests/test_race_probe.py, the kernels' interpreter race tests).
# Everything goes to $OUT/fa3_racecheck_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3race_out fa3_racecheck_log.txt
export PATH=$PATH:/usr/local/cuda/bin XLA_PYTHON_CLIENT_PREALLOCATE=false
tool=${TOOL:-racecheck}
step version 20 3 compute-sanitizer --version
san="compute-sanitizer --tool $tool --kernel-name kns=fa3_ --print-limit 20"
if [ "${CONTROLS:-1}" = 1 ]; then
  nvcc -arch=sm_90a -lineinfo -o /tmp/race_control benchmarks/racecheck_control/race.cu
  step "${tool}_control_cuda" 60 6 compute-sanitizer --tool "$tool" --print-limit 3 /tmp/race_control race
  step "${tool}_control_mosaic" 60 3 $san python3 benchmarks/racecheck_probe.py --race
  step "${tool}_control_mosaic_tma" 60 3 $san python3 benchmarks/racecheck_probe.py --race --tma
fi
fwd="python3 -m pallas_kernels.flash_attention --small --no-check"
bwd="python3 -m pallas_kernels.flash_attention_bwd --small --no-check"
for c in ${CASES:-bwd64 bwd64c bwd64v1 bwd128 bwd128c fwd128 fwd128g fwd256c fwd256p fp8_128 fp8_256}; do
  case $c in
    bwd64) step "${tool}_$c" 90 3 $san $bwd --head-dim 64 ;;                      # the default: 128-row steps
    bwd64c) step "${tool}_$c" 90 3 $san $bwd --head-dim 64 --causal ;;
    bwd64v1) step "${tool}_$c" 90 3 $san $bwd --head-dim 64 --block-q-dkv 64 --block-kv-dq 64 ;;
    bwd128) step "${tool}_$c" 90 3 $san $bwd --head-dim 128 ;;
    bwd128c) step "${tool}_$c" 90 3 $san $bwd --head-dim 128 --causal ;;
    fwd128) step "${tool}_$c" 90 3 $san $fwd --head-dim 128 ;;                   # default_config's pick at S=300
    fwd128g) step "${tool}_$c" 90 3 $san $fwd --head-dim 128 --schedule grid ;;
    fwd256c) step "${tool}_$c" 90 3 $san $fwd --head-dim 256 --causal ;;
    fwd256p) step "${tool}_$c" 90 3 $san $fwd --head-dim 256 --schedule persistent --num-ctas 2 ;;
    fp8_128) step "${tool}_$c" 90 3 $san $fwd --fp8 --head-dim 128 --schedule persistent --num-ctas 2 ;;
    fp8_256) step "${tool}_$c" 90 3 $san $fwd --fp8 --head-dim 256 ;;
    *) echo "unknown case $c" ;;
  esac
done
grep -E "SUMMARY|Race reported|not checked|out\[|rc=" "$STEP_LOG" | tail -60
