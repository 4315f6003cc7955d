#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf: the probes import specjax):
#   bash benchmarks/skinny_gemm_gpu.sh
# The verify forward's GEMMs (benchmarks/NOTES.md item 46), four steps, the most decisive first:
# 1. skinny_gemm_probe.py: XLA at T=1 and 8, the Mosaic GPU kernel at 8, 30 matmuls per loop iteration, XLA's
#    Triton configs printed.
# 2. verify_cost_probe.py's forward at T = 6 and 8 (K = 5, 7): the default and mgpu_linear (the kernel for every
#    bf16 matmul of 2-64 rows), once each (the probe runs each named variant once; the repeat is ignored).
# 3. its K=5 cycles of a random draft model and a random EAGLE-3 head, each with and without the kernel.
# 4. verify_forward_probe.py's trace of the T=5 forward (kernels and GPU time by kind), both forms.
# Log: $OUT/skinny_gemm_log.txt; this script's run: results/skinny_gemm_H100_2026-12-06_run2_log.txt. The first
# run (results/skinny_gemm_H100_2026-12-06_log.txt) had one matmul per loop iteration (now 30) and its forward step was cut by its limit while compiling (every call site then lowered
# the kernel anew; now one shared lowering, skinny_gemm_probe.jitted).
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/skinny_out skinny_gemm_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gemm "${GEMM_S:-130}" 80 python3 benchmarks/skinny_gemm_probe.py --ts 1,8 --bns 8,16,32 --configs --rounds 2
# the forward at T = 6 / 8 (K = 5 / 7) and the K=5 cycles, default and kernel (verify_cost_probe.py)
step fwd "${FWD_S:-150}" 40 python3 benchmarks/verify_cost_probe.py --ts 6,8 \
  --variants default,mgpu_linear,default,mgpu_linear --ks "" --drafters "" --ar-rounds 0
step cyc "${CYC_S:-180}" 40 python3 benchmarks/verify_cost_probe.py --ts "" --variants default --ks 5 \
  --drafters draft,draft+mgpu_linear,eagle3,eagle3+mgpu_linear --ar-rounds 0
# the T=5 forward's kernels, default and kernel (verify_forward_probe.py's trace)
step prof "${PROF_S:-90}" 60 python3 benchmarks/verify_forward_probe.py --variants default,mgpu_linear --ts 5 \
  --profile 5 --hlo "" --rounds 1
true
