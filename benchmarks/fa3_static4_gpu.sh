#!/usr/bin/env bash
# One device call, from the repo root, carrying .whl: the FA3 table (bench_fa3.py, 4 rounds) with TUNED's "+kend"
# (hd 64 non-causal: static masks as k_end arrays); the second table of the static masks (NOTES v17).
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3static4_out fa3_static4_log.txt
step table "${TABLE_S:-300}" 12 python3 benchmarks/bench_fa3.py --rounds 4 --tag _static2 --out "$OUT"
true
