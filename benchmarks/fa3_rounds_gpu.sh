#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): is the FA3 table's timing order behind the rows that sit below
# the probes (pallas_kernels/NOTES.md v15)? The table with 4 timing rounds per row, the implementations' order
# reversed every round: each row keeps its rounds (`*_tflops_rounds`; even rounds timed specjax first, as the tables
# up to v14 did, odd ones last), so one run shows the order's effect and the table without it.
# Output: $OUT/rounds_log.txt and the table fa3_<device>_<date>_rounds.{json,md}.
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out rounds_log.txt
step table 400 80 python3 benchmarks/bench_fa3.py --rounds 4 --tag _rounds --out "$OUT"
