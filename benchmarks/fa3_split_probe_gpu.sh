#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (pytest-xdist, execnet):
#   bash benchmarks/fa3_split_probe_gpu.sh
# v25, split_tail (label suffix /t1): the items of the persistent grid's last, partial round cut at KV-block boundaries
# to even out the CTAs (stream-K over the tail), merged by LSE after the kernel. First the GPU tests of the
# split forms against the float32 reference, then each row's pick against the same pick split (both twice, alternated:
# the probe's spread between two timings of one config reached 4 % at hd 128 16k in v24), and at the rows whose pick is
# the grid, persistent forms split; then hd 64's causal rows, where results/fa3_waves_cpu_2026-12-05_split.txt predicts
# +0.5-2 % (hd 128 causal 2k, predicted 0.955x from the pieces' fixed cost, as a check of that count).
# Log: $OUT/fa3_split_probe_log.txt. Its run: results/fa3_split_probe_H100_2026-12-05_log.txt (then at -n 8, where the
# GPU tests ran out of memory; fa3_split_diag_gpu.sh ran them at 4 workers).
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3split_out fa3_split_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gpu_tests "${TESTS_S:-200}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 4 -k split_tail
P="python3 benchmarks/fa3_configs_probe.py"
A="default,default/t1,default,default/t1"
step hd128n $((${PROBE_S:-60})) 40 $P 128:1024:n,128:2048:n,128:4096:n,128:512:n $A --new-only --iters 40
step hd128g $((${PROBE_S:-60})) 40 $P 128:8192:n,128:16384:n default,192/2/P/t1,128/2/P+O/t1,192/2/P,default,192/2/P/t1 --new-only --iters 40
step hd256n $((${PROBE_S:-60})) 40 $P 256:1024:n,256:2048:n,256:512:n $A --new-only --iters 40
step hd256g $((${PROBE_S:-60})) 40 $P 256:4096:n,256:8192:n,256:16384:n default,128/1/P/a1/t1,128/1/B/a1/t1,128/1/P/a1,default,128/1/P/a1/t1 --new-only --iters 40
step hd64n $((${PROBE_S:-60})) 40 $P 64:1024:n,64:2048:n,64:4096:n,64:8192:n,64:16384:n,64:512:n $A --new-only --iters 40
step causal $((${PROBE_S:-60})) 50 $P 64:512:c,64:1024:c,64:2048:c,64:4096:c,64:8192:c,128:2048:c $A --new-only --iters 40
true
