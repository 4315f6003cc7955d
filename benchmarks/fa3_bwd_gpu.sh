#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf: specjax imports it; pytest-xdist and
# execnet for TESTS_FIRST's -n 4):
#   TAG=_v2 bash benchmarks/fa3_bwd_gpu.sh                  # v1's table call, as it ran
#   TESTS_FIRST=1 TESTS_S=150 MAIN=q128 RACE=0 TAG=_q128 BENCH_S=300 BENCH_ARGS="--blocked-max 0 \
#     --variant q128:block_q_dkv=128 --variant dq128:block_kv_dq=128 --variant both:block_q_dkv=128,block_kv_dq=128" \
#     bash benchmarks/fa3_bwd_gpu.sh                         # v2's first call (128-row dK/dV steps at hd 64), as it ran
#   TESTS_FIRST=1 TESTS_S=90 TESTS_K=custom_vjp MAIN=none TAG=_v2 BENCH_ARGS="--blocked-max 0 \
#     --variant v1:block_q_dkv=64,block_kv_dq=64" bash benchmarks/fa3_bwd_gpu.sh   # v2's table, hd 64's pick taken
#   TESTS_FIRST=1 TESTS_S=170 TESTS_K="256" MAIN=hd256 RACE=0 TAG=_hd256 BENCH_S=250 \
#     BENCH_ARGS="--head-dims 256 --blocked-max 16384" bash benchmarks/fa3_bwd_gpu.sh   # hd 256's two dK/dV passes
#   TESTS_FIRST=1 TESTS_S=150 TESTS_K=fused MAIN=fused RACE=0 FWD_GRAD=1 FWD_GRAD_S=110 TAG=_fused BENCH_S=200 \
#     BENCH_ARGS="--head-dims 64,128 --blocked-max 0 --rounds 2 --variant fused:fused_dq=1" \
#     bash benchmarks/fa3_bwd_gpu.sh                         # the one-kernel backward (fused_dq) against two kernels
#   TESTS_FIRST=1 TESTS_S=100 TESTS_K="fused and bfloat16" MAIN=fused FUSED_ALL=0 RACE=0 FWD_GRAD=1 FWD_GRAD_S=120 \
#     TAG=_fusedB BENCH_S=60 BENCH_ARGS="--quick --head-dims 128,64 --blocked-max 0 --rounds 2 \
#     --variant fused:fused_dq=1" bash benchmarks/fa3_bwd_gpu.sh   # its final form, in the session's last 313 s
#   TESTS_FIRST=1 TESTS_S=130 TESTS_K=fused MAIN=ptxas AB_FUSED=1 RACE=0 BENCH_S=0 \
#     bash benchmarks/fa3_bwd_gpu.sh                         # backward v5's one-step lag, against v4's one kernel
#   ABLATION=1 MAIN=none RACE=0 BENCH_S=0 TESTS_FIRST=1 TESTS_S=170 TESTS_K=fused \
#     bash benchmarks/fa3_bwd_gpu.sh                         # v5: where the one kernel's time goes
#   ABLATION=1 ABL_PTXAS=1 ABL_SEQS="4096 1024 16384" ABL_VARIANTS=noreduce,nostore,nodq,nomeet,splitdkv MAIN=none \
#     RACE=0 BENCH_S=0 bash benchmarks/fa3_bwd_gpu.sh        # v5, session 71: spills per variant, the split's dK/dV kernel
# The FA3 backward kernels (pallas_kernels/flash_attention_bwd.py): (TESTS_FIRST=1) the backward's GPU tests, 4
# workers; main() (error against the float32 reference, per-kernel CUPTI times, TFLOPS, wall clock) at hd 128 / 64
# for the default config and a few others (MAIN=all; MAIN=q128: hd 64 with 64- and 128-row dK/dV steps; MAIN=hd256:
# hd 256 non-causal and causal, and ptxas' register / spill report; MAIN=fused: hd 128 / 64 with fused_dq 0 and
# 1, then (unless FUSED_ALL=0) causal hd 128 and ptxas' report of the fused kernel; MAIN=ptxas: that report alone;
# any other value, e.g. MAIN=none: no main() step); AB_FUSED=1: bwd_ab_probe.py --fused (the one kernel against
# benchmarks/_bwd_prev.py's, and the split) at hd 128 / 64, 4k non-causal and causal, 16k, 1k; ABLATION=1:
# bwd_fused_ablation.py at hd 128 / 64 (ABL_SEQS: the lengths, default 4k 1k 16k; ABL_VARIANTS: its --variants;
# ABL_PTXAS=1: then ptxas' spill report of each variant's kernel, in compile order);
# FWD_GRAD=1: the forward file's GPU tests through the custom_vjp; (unless BENCH_S=0) the backward table
# (bench_fa3_bwd.py, also into $OUT); one
# compute-sanitizer racecheck run (RACE=1); then (RUN_TESTS=1) the GPU tests in one process. Everything but the
# table goes to $OUT/fa3_bwd_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3bwd_out fa3_bwd_log.txt
if [ "${TESTS_FIRST:-0}" = 1 ]; then
  step gpu_tests "${TESTS_S:-200}" 25 env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -m gpu \
    tests/test_flash_attention_bwd.py -q -rfEs -p no:cacheprovider --tb=short -n 4 -k "${TESTS_K:-}"
fi
main="python3 -m pallas_kernels.flash_attention_bwd"
fused_ptxas() {   # ptxas' register / spill report of the one kernel (fused_dq) at hd 128 and 64
  for hd in 128 64; do
    step ptxas${hd} 45 12 bash -c "MOSAIC_GPU_DUMP_PTXAS=1 $main --small --head-dim $hd --fused-dq 1 2>&1 \
      | grep -i -E 'spill|registers|fa3_bwd|relative'"
  done
}
if [ "${MAIN:-all}" = all ]; then
  step main128 60 4 $main --seq 4096 --head-dim 128
  step main128_s3 40 3 $main --seq 4096 --head-dim 128 --stages-dkv 3
  step main128_kv128 40 3 $main --seq 4096 --head-dim 128 --block-kv-dq 128
  step main64 40 3 $main --seq 4096 --head-dim 64
  step main64_kv128 40 3 $main --seq 4096 --head-dim 64 --block-kv-dq 128
elif [ "$MAIN" = hd256 ]; then   # the two dK/dV passes: per-kernel times, then ptxas' spill report
  step main256 45 4 $main --seq 4096 --head-dim 256
  step main256c 45 4 $main --seq 4096 --head-dim 256 --causal
  step ptxas256 45 12 bash -c "MOSAIC_GPU_DUMP_PTXAS=1 $main --small --head-dim 256 2>&1 \
    | grep -i -E 'spill|registers|fa3_bwd|relative'"
elif [ "$MAIN" = fused ]; then   # the one-kernel backward against the two kernels, then ptxas on it
  for hd in 128 64; do
    step main${hd}_two 40 3 $main --seq 4096 --head-dim $hd --fused-dq 0
    step main${hd}_fused 40 3 $main --seq 4096 --head-dim $hd --fused-dq 1
  done
  [ "${FUSED_ALL:-1}" = 1 ] && step main128c_fused 40 3 $main --seq 4096 --head-dim 128 --causal --fused-dq 1
  [ "${FUSED_ALL:-1}" = 1 ] && fused_ptxas
elif [ "$MAIN" = ptxas ]; then
  fused_ptxas
elif [ "$MAIN" = q128 ]; then
  step main64 40 3 $main --seq 4096 --head-dim 64
  step main64_q128 40 3 $main --seq 4096 --head-dim 64 --block-q-dkv 128
  step main64_q128_kv128 40 3 $main --seq 4096 --head-dim 64 --block-q-dkv 128 --block-kv-dq 128
fi
if [ "${AB_FUSED:-0}" = 1 ]; then   # the one kernel against benchmarks/_bwd_prev.py's and the split (bwd_ab_probe.py)
  for case in "4096" "4096 --causal" "16384" "1024"; do
    step "ab_${case// /_}" 60 6 python3 benchmarks/bwd_ab_probe.py --fused --rounds 3 --head-dims 128,64 --seq $case
  done
fi
if [ "${ABLATION:-0}" = 1 ]; then   # the one kernel with its dQ pieces cut away one by one (bwd_fused_ablation.py)
  for seq in ${ABL_SEQS:-4096 1024 16384}; do
    step ablation_$seq 120 4 python3 benchmarks/bwd_fused_ablation.py --rounds 3 --head-dims 128,64 --seq $seq \
      ${ABL_VARIANTS:+--variants $ABL_VARIANTS}
  done
  [ "${ABL_PTXAS:-0}" = 1 ] && step ablation_ptxas 120 40 bash -c "MOSAIC_GPU_DUMP_PTXAS=1 python3 \
    benchmarks/bwd_fused_ablation.py --rounds 1 --head-dims 128,64 --seq 1024 ${ABL_VARIANTS:+--variants $ABL_VARIANTS} \
    2>&1 | grep -E 'spill stores|hd 128|hd 64|Compiling entry'"
fi
if [ "${FWD_GRAD:-0}" = 1 ]; then   # the forward file's GPU tests that differentiate through the custom_vjp
  step fwd_grad "${FWD_GRAD_S:-120}" 12 env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -m gpu \
    tests/test_flash_attention.py -q -rA -p no:cacheprovider --tb=short -n 4 -k "grad or differentiable or vjp"
fi
[ "${BENCH_S:-330}" != 0 ] && step bench "${BENCH_S:-330}" 45 python3 benchmarks/bench_fa3_bwd.py ${BENCH_ARGS:-} --tag "${TAG:-}"
[ "${RACE:-1}" = 1 ] && step race 140 4 compute-sanitizer --tool racecheck $main --small
if [ "${RUN_TESTS:-0}" = 1 ]; then
  step gpu_tests "${TESTS_S:-260}" 25 python3 -m pytest -m gpu tests/test_flash_attention_bwd.py -q -rfEs \
    -p no:cacheprovider --tb=short -k "${TESTS_K:-}"
fi
true
