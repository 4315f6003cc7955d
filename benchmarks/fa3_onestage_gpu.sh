#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): the one-stage FA3 kernel (TuningConfig(num_stages=1), 128-key
# blocks at hd 256, the ring slot kept opaque so the wgmma descriptors stay in the KV loop; pallas_kernels/NOTES.md v12).
#   bash benchmarks/fa3_onestage_gpu.sh
# 1. its GPU tests against the float32 reference (outputs poisoned first);
# 2. ptxas's spill lines for its three schedules (v12 measured 280-356 bytes before the opaque slot);
# 3. TFLOPS of 128/1/G, 128/1/P, 128/1/P/s1 against each row's default and cuDNN at hd 256, one process.
# Everything goes to $OUT/onestage_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out onestage_log.txt
step tests 200 3 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k 1stage -p no:cacheprovider
MOSAIC_GPU_DUMP_PTXAS=1 step probe 300 0 python3 benchmarks/fa3_configs_probe.py \
  256:512:n,256:1024:n,256:2048:n,256:4096:n,256:16384:n,256:4096:c default,128/1/G,128/1/P,128/1/P/s1 --new-only
grep -E "passed|failed|TFLOPS|bytes spill stores|rc=" "$STEP_LOG" | grep -v "^ptxas warning"
