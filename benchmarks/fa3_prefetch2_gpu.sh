#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry .whl): TuningConfig(prefetch=True) against each row's default
# (HEAD's TUNED pick) with the same blocks and schedule, on the rows whose picks have O tiles (hd 64 / 128,
# persistent), in two processes with the configs in opposite orders; then the GPU tests of prefetch.
# Output: $OUT/prefetch2_log.txt (results/fa3_prefetch_probe_H200_<date>_rows.txt).
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out prefetch2_log.txt
P=benchmarks/fa3_configs_probe.py
G1=64:512:c,64:1024:c,128:512:c,128:1024:c,128:2048:c,128:4096:c
G2=64:2048:c,64:4096:c,64:8192:c,64:512:n,64:2048:n,64:4096:n
G3=128:512:n,128:1024:n,128:2048:n,128:4096:n
step tests 150 3 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k prefetch
for order in 1 2; do
  c1=default,128/2/P/f1; c2=default,256/2/P/f1; c3=default,128/2/P+O/f1; c4=default,128/2/P/c3/f1
  if [ $order = 2 ]; then c1=128/2/P/f1,default; c2=256/2/P/f1,default; c3=128/2/P+O/f1,default; c4=128/2/P/c3/f1,default; fi
  step g1_$order 70 0 python3 $P $G1 $c1 --new-only
  step g2_$order 70 0 python3 $P $G2 $c2 --new-only
  step g3_$order 50 0 python3 $P $G3 $c3 --new-only
  step g4_$order 30 0 python3 $P 64:8192:n $c4 --new-only
done
grep -E "TFLOPS|rc=|passed|failed" "$STEP_LOG"
