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
step hd64n $L 40 $P 64:512:n,64:1024:n,64:2048:n,64:4096:n,64:8192:n,64:16384:n $A --new-only --iters 40
step hd128n $L 40 $P 128:512:n,128:1024:n,128:2048:n,128:4096:n,128:8192:n,128:16384:n $A --new-only --iters 40
step hd256n $L 40 $P 256:512:n,256:1024:n,256:2048:n,256:4096:n,256:8192:n,256:16384:n $A --new-only --iters 40
step hd64c $L 40 $P 64:512:c,64:1024:c,64:2048:c,64:4096:c,64:8192:c,64:16384:c $A --new-only --iters 40
step hd128c $L 40 $P 128:512:c,128:1024:c,128:2048:c,128:4096:c,128:8192:c,128:16384:c $A --new-only --iters 40
step hd256c $L 40 $P 256:512:c,256:1024:c,256:2048:c,256:4096:c,256:8192:c,256:16384:c $A --new-only --iters 40
step gpu_tests "${TESTS_S:-150}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 4 -k lazy
true
