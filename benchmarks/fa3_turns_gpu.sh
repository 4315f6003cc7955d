#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): the one-stage FA3 kernel with every wgmma a ping-pong turn of
# its own (TuningConfig(alternate_gemms=True): QK QK PV PV, so a one-stage ring's refill has two GEMMs of time, not one;
# pallas_kernels/NOTES.md v13).
#   bash benchmarks/fa3_turns_gpu.sh
# 1. the one-stage GPU tests (with and without turns) against the float32 reference (outputs poisoned first);
# 2. ptxas's spill lines and TFLOPS of the one-stage forms with and without turns against each row's default and cuDNN
#    at hd 256, and of the default blocks with turns, one process.
# Everything goes to $OUT/turns_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out turns_log.txt
step tests 200 3 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k 1stage -p no:cacheprovider
MOSAIC_GPU_DUMP_PTXAS=1 step probe 330 0 python3 benchmarks/fa3_configs_probe.py \
  256:512:n,256:2048:n,256:4096:n,256:16384:n,256:4096:c,128:4096:n \
  default,128/1/G,128/1/G/a1,128/1/P/s1,128/1/P/s1/a1,64/2/G,64/2/G/a1 --new-only
grep -E "passed|failed|TFLOPS|bytes spill stores|rc=" "$STEP_LOG" | grep -v "^ptxas warning"
