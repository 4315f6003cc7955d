#!/usr/bin/env bash
# The decode/verify attention kernel (pallas_kernels/decode_attention.py) on one Hopper GPU, in one
# device call of at most 8 minutes, from the repo root:   bash benchmarks/decode_kernel_gpu.sh
#   1. its GPU tests           2. its micro-benchmark (kernel vs XLA attention, split sizes)
#   3. AR decode ms/token, SmolLM2 shape and Llama-3-8B shape, with the kernel (_deckernel) and with
#      SPECJAX_DECODE_KERNEL=0 (_nodeckernel: T=1 on XLA's attention, verify on FA3, as before).
# SKIP_TESTS=1 / SKIP_KBENCH=1 leave out steps 1 / 2; TESTS_K=EXPR passes -k EXPR to step 1.
# Each step's log goes to $OUT/<step>.txt (bench_decode.py also copies its results files to $OUT:
# 8 files in all); only the tails print. A failing or timed-out step does not stop the next one.
set -uo pipefail
export PYTHONPATH=.:benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
OUT=${OUT:-/tmp/decode_kernel_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

source benchmarks/device_lib.sh  # step, install_whl
install_whl  # gguf (specjax imports it)

[ -z "${SKIP_TESTS:-}" ] && step gpu_tests 150 15 python3 -m pytest -m gpu tests/test_decode_attention.py -q -rfEs -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} --tb=short
[ -z "${SKIP_KBENCH:-}" ] && step kernel_bench 110 22 python3 pallas_kernels/decode_attention.py
step bench_deckernel 150 8 python3 benchmarks/bench_decode.py --models smollm-shape,8b --tag _deckernel
step bench_nodeckernel 150 8 env SPECJAX_DECODE_KERNEL=0 \
  python3 benchmarks/bench_decode.py --models smollm-shape,8b --tag _nodeckernel
