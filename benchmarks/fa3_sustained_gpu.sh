#!/usr/bin/env bash
# Device calls (<= 10 min each) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl; one dtype's table in
# two calls on one machine (the second within the 30 s the machine stays warm):
#   DTYPE=bfloat16 STEPS=burst bash benchmarks/fa3_sustained_gpu.sh       # ~140 s
#   DTYPE=bfloat16 STEPS=sustained bash benchmarks/fa3_sustained_gpu.sh   # ~400 s
# (then DTYPE=float16 the same way). ROWS=HD:S:c|n,... times only those rows (bench_fa3.py --rows).
# The 16-bit FA3 table of one dtype twice, one process after the other on one machine: the burst measure
# (bench_fa3.py, CUPTI, 4 rounds, cuDNN and attention_mgpu beside), then the sustained measure (--sustained: each implementation called
# back to back, 0.5 s untimed then 1.0 s timed per round, 2 rounds, nvidia-smi's clock and power per row;
# pallas_kernels/NOTES.md v29-v30). Measured on an H100 (v30): the burst table 140 s; the sustained one ~7.5 s per row
# after its compiles (33 of 36 rows in 330 s), so both in one call no longer fit a call's 600 s.
# Log: $OUT/fa3_sustained_log.txt; tables fa3_<device>_<date>${TAG}{,_sustained}.*
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3sus_out fa3_sustained_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
case "$DTYPE" in bfloat16) short=bf16 ;; float16) short=fp16 ;; *) echo "DTYPE: bfloat16 or float16"; exit 2 ;; esac
TAG=${TAG:-_v30$short}
rows=(); [ -n "${ROWS:-}" ] && rows=(--rows "$ROWS")
for what in ${STEPS:?"STEPS=burst or STEPS=sustained: one call each (both no longer fit 600 s)"}; do
  case "$what" in
    burst) step burst "${BURST_S:-200}" 40 python3 benchmarks/bench_fa3.py --dtypes "$DTYPE" "${rows[@]}" --rounds 4 \
             --tag "$TAG" --out "$OUT" ;;
    sustained) step sustained "${SUSTAINED_S:-540}" 40 python3 benchmarks/bench_fa3.py --dtypes "$DTYPE" "${rows[@]}" \
                 --sustained 1.0 --warm 0.5 --rounds 2 --tag "${TAG}_sustained" --out "$OUT" ;;
    *) echo "STEPS: burst and / or sustained; got $what"; exit 2 ;;
  esac
done
true
