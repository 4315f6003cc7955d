#!/usr/bin/env bash
# One device call (GPU machine, repo root, carry benchmarks/_fa_head.py = HEAD's flash_attention.py): the
# persistent kernel's consumers fetching the next item's k_end row and tile min / max one item ahead, against
# HEAD's kernel in the same process, each row's default config, both orders; then the producer loading an
# item's first K/V block(s) before its Q tiles where O has tiles of its own (--o-tiles-lead 1, 2).
# Output: $OUT/prefetch_log.txt (results/fa3_prefetch_probe_H200_<date>.txt).
# As run (2026-11-29), on an intermediate of the code: the prefetch was always on, and steps C / D set the producer's
# lead through a probe option (--o-tiles-lead) that was removed when the code became TuningConfig(prefetch=True),
# so C and D do not run on this tree; step C's form is the /f1 label now (fa3_prefetch2_gpu.sh).
set -uo pipefail
source benchmarks/device_lib.sh
probe_setup /tmp/out prefetch_log.txt
OT=64:512:c,64:1024:c,64:2048:c,64:512:n,64:2048:n,64:8192:n,128:512:c,128:1024:c,128:512:n,128:2048:n
R=$OT,256:512:n,256:1024:n,256:1024:c,256:4096:c,256:16384:n
MOSAIC_GPU_DUMP_PTXAS=1 step A 170 0 python3 benchmarks/fa3_configs_probe.py $R default
step B 150 0 python3 benchmarks/fa3_configs_probe.py $R default --head-first
step C 110 0 python3 benchmarks/fa3_configs_probe.py $OT default --o-tiles-lead 1
step D 110 0 python3 benchmarks/fa3_configs_probe.py $OT default --o-tiles-lead 2
grep -E "TFLOPS|rc=|spill" "$STEP_LOG" | grep -v " 0 bytes spill stores, 0 bytes spill loads"
