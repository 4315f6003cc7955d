#!/usr/bin/env bash
# Device call (one H200): the verify forward and cycles with each row of a <= 16-row matmul as its own reduction
# (benchmarks/verify_cost_probe.py sibling_linear / variadic_linear). Results: results/sibling_probe_H200_*.txt.
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /root/out sibling_probe.txt
step fwd 300 40 python3 benchmarks/verify_cost_probe.py --ts 1,2,6,8 --variants default,sibling_linear,variadic_linear,default --ks "" --drafters "" --ar-rounds 0
step cyc 280 40 python3 benchmarks/verify_cost_probe.py --ts "" --variants default,sibling_linear,variadic_linear --ks 5 --drafters draft,draft+sibling_linear,draft+variadic_linear,eagle3,eagle3+sibling_linear,eagle3+variadic_linear --ar-rounds 0
cp /root/out/* "$OUT"/ 2>/dev/null || true
