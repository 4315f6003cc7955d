#!/usr/bin/env bash
# Decode ms/token under XLA flag variants (one process each), for choosing the defaults in
# specjax/xla_flags.py. Usage: bash benchmarks/xla_variants.sh MODELS  (e.g. smollm-shape or smollm-shape,8b)
models=${1:-smollm-shape}
declare -A V=(
  [default]=""
  [nosr]="--xla_gpu_enable_dot_strength_reduction=false"
  [notriton]="--xla_gpu_enable_triton_gemm=false"
  [nosr_notriton]="--xla_gpu_enable_dot_strength_reduction=false --xla_gpu_enable_triton_gemm=false"
)
for name in default nosr notriton nosr_notriton; do
  echo "== $name: ${V[$name]}"
  XLA_FLAGS="${V[$name]}" python3 benchmarks/bench_decode.py --models "$models" --tag "_xla_$name" 2>&1 \
    | grep -E "^\| (smollm|llama)|bandwidth"
done
