#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl:
#   DTYPE=bfloat16 bash benchmarks/fa3_sustained_gpu.sh      # then, on the same machine,
#   DTYPE=float16 bash benchmarks/fa3_sustained_gpu.sh
# The 16-bit FA3 table of one dtype twice, one process after the other on one machine: the burst measure
# (bench_fa3.py, CUPTI, 4 rounds, cuDNN and attention_mgpu beside), then the sustained measure (--sustained: each implementation called
# back to back, 0.5 s untimed then 1.0 s timed per round, 2 rounds, nvidia-smi's clock and power per row;
# pallas_kernels/NOTES.md v29-v30). Log: $OUT/fa3_sustained_log.txt; tables fa3_<device>_<date>${TAG}{,_sustained}.*
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3sus_out fa3_sustained_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
case "$DTYPE" in bfloat16) short=bf16 ;; float16) short=fp16 ;; *) echo "DTYPE: bfloat16 or float16"; exit 2 ;; esac
TAG=${TAG:-_v30$short}
step burst "${BURST_S:-200}" 40 python3 benchmarks/bench_fa3.py --dtypes "$DTYPE" --rounds 4 --tag "$TAG" --out "$OUT"
step sustained "${SUSTAINED_S:-330}" 40 python3 benchmarks/bench_fa3.py --dtypes "$DTYPE" --sustained 1.0 --warm 0.5 \
  --rounds 2 --tag "${TAG}_sustained" --out "$OUT"
true
