#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (gguf, pytest-xdist,
# execnet):
#   bash benchmarks/fa3_lazy_probe_gpu.sh
# v26, lazy_rescale (label suffix /l1; FA4's conditional rescaling): a row's running max moves only when a block's
# scores pass it by more than 2^8, and a warp whose 16 rows all keep theirs skips O's multiply. First every bf16 row
# of the FA3 table, each row's pick against the same pick with /l1, both twice, alternated; then the GPU tests of every
# TUNED config with it against the float32 reference.
# Log: $OUT/fa3_lazy_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3lazy_out fa3_lazy_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
P="python3 benchmarks/fa3_configs_probe.py"
A="default,default/l1,default,default/l1"
L=${PROBE_S:-75}
for m in n c; do  # ran as hd64n, hd128n, hd256n, hd64c, hd128c, hd256c
  for hd in 64 128 256; do
    step hd$hd$m $L 40 $P $(printf "$hd:%s:$m," 512 1024 2048 4096 8192 16384 | sed 's/,$//') $A --new-only --iters 40
  done
done
step gpu_tests "${TESTS_S:-150}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 4 -k lazy
true
