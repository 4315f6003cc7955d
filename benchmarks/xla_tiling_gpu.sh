#!/usr/bin/env bash
# One device call, from the repo root, carrying .whl (verify_cost_probe.py imports specjax):
#   [ROUNDS=2] bash benchmarks/xla_tiling_gpu.sh
# Does XLA's Triton GEMM search space hold a faster tiling for the verify forward's GEMMs (benchmarks/NOTES.md
# item 47)? Item 19 passed xla_gpu_exhaustive_tiling_search as a per-jit compiler option after the default had
# compiled the same fusions in that process, and saw no change (XLA may have reused the autotuner's results of that compilation).
# Here each form is its own process, the flag in XLA_FLAGS: the verify forward at T = 6 and 8 (verify_cost_probe.py),
# default / exhaustive / split-K off in each round, the autotuner's choices of the first round dumped to $OUT.
# Split-K off: item 46's trace had XLA fuse each residual add into the next norm's reduction when the o and down
# products came whole (a custom call); item 41 read split-K 8 for them in XLA's HLO, the partial sums added apart.
# Result (one H100, 2026-12-06): results/xla_tiling_H100_2026-12-06_log.txt; the exhaustive search chose other configs
# and was level with the default, the split-K flag 21 % slower (NOTES item 47).
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/tiling_out xla_tiling_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
EXH=--xla_gpu_exhaustive_tiling_search=true
NOSPLIT=--xla_gpu_experimental_force_split_k=1  # o and down without split-K (this jaxlib no longer parses
# xla_gpu_enable_split_k_autotuning): no partial sums to add apart; the dump shows whether it took
FWD=(python3 benchmarks/verify_cost_probe.py --ts 6,8 --variants default --ks "" --drafters "" --ar-rounds 0)
DUMP=--xla_gpu_dump_autotune_results_to  # the configs the autotuner chose (text proto), first round only
for r in $(seq "${ROUNDS:-2}"); do
  d() { [ "$r" = 1 ] && echo "$DUMP=$OUT/autotune_$1.txt"; }
  XLA_FLAGS="$(d default)" step "fwd_default_$r" 50 10 "${FWD[@]}"
  XLA_FLAGS="$EXH $(d exhaustive)" step "fwd_exhaustive_$r" 140 10 "${FWD[@]}"
  XLA_FLAGS="$NOSPLIT $(d nosplitk)" step "fwd_nosplitk_$r" 50 10 "${FWD[@]}"
done
true
