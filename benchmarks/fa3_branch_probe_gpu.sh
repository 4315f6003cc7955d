#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (gguf, pytest-xdist,
# execnet) and benchmarks/_fa_head.py (`git show <rev>:pallas_kernels/flash_attention.py > benchmarks/_fa_head.py`):
#   bash benchmarks/fa3_branch_probe_gpu.sh        # v28 (pallas_kernels/NOTES.md)
# 1. the FP8 GPU tests (-k "fp8_lazy or gpu_fp8_matches"; 110 s cut them short: fa3_fp8_table_gpu.sh runs them
#    with more time);
# 2. fp8_config with lazy_rescale off and on (label suffixes /l0, /l1) at hd 256 non-causal, both twice, alternated;
# 3. the kernel with O's lazy rescale before P's exp2s in the non-overlap step ("new"; ran with
#    `git apply benchmarks/results/fa3_branch_before_exp2_2026-12-06.diff`, reverted after this probe, NOTES v28)
#    against _fa_head.py's ("head", 263232e's kernel), bf16 rows where the non-overlap step runs (the TUNED +lazy
#    rows and the rows still behind cuDNN), each row's pick and the pick with /l1, once new first and once head
#    first; then FP8 rows.
# Log: $OUT/fa3_branch_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3branch_out fa3_branch_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
P="python3 benchmarks/fa3_configs_probe.py"
step fp8_tests 110 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs -p no:cacheprovider \
  --tb=short -n 4 -k "fp8_lazy or gpu_fp8_matches"
step fp8_hd256n 70 20 $P 256:1024:n,256:2048:n,256:4096:n,256:8192:n,256:16384:n \
  default/l0,default/l1,default/l0,default/l1 --new-only --iters 40 --dtype float8_e4m3fn
R=64:2048:n,128:4096:c,128:16384:c,256:512:c,256:16384:c,256:2048:n,256:8192:n,256:16384:n,128:8192:n,128:16384:n
step bf16_new_first 150 45 $P $R default,default/l1 --iters 40
step bf16_head_first 150 45 $P $R default,default/l1 --iters 40 --head-first
step fp8_new_head 80 20 $P 64:4096:n,128:4096:n,128:16384:n,256:4096:n default/l0,default/l1 --iters 40 \
  --dtype float8_e4m3fn
true
