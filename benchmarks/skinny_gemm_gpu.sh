#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf: verify_forward_probe.py imports specjax):
#   bash benchmarks/skinny_gemm_gpu.sh
# The verify forward's GEMMs (benchmarks/NOTES.md item 46): skinny_gemm_probe.py with XLA's defaults (XLA at T=1
# and 8, the Mosaic GPU kernel at 8, XLA's Triton configs), XLA's GEMMs again with its exhaustive tiling search
# (XLA_FLAGS, so it reaches the autotuner), then the whole forward at T = 1, 5, 8 with the kernel for every matmul
# of 2-64 rows (verify_forward_probe.py's mgpu_linear) against the default, with the T=5 kernel profile. Log: $OUT/skinny_gemm_log.txt.
# Its first run (results/skinny_gemm_H100_2026-12-06_log.txt) had one matmul per loop iteration (now 30) and a
# 200 s forward step whose limit cut it before any timing, in its T=8 compilations (now 300 s).
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/skinny_out skinny_gemm_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gemm "${GEMM_S:-150}" 80 python3 benchmarks/skinny_gemm_probe.py --ts 1,8 --bns 8,16,32 --configs --rounds 2
XLA_FLAGS=--xla_gpu_exhaustive_tiling_search=true step gemm_exhaustive "${EXH_S:-100}" 30 \
  python3 benchmarks/skinny_gemm_probe.py --ts 8 --bns "" --configs --rounds 2
step fwd "${FWD_S:-300}" 60 python3 benchmarks/verify_forward_probe.py --variants default,mgpu_linear --ts 1,5,8 \
  --profile 5 --hlo "" --rounds 2
true
