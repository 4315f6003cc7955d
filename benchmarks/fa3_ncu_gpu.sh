#!/usr/bin/env bash
# Nsight Compute profile of the FA3 kernel and cuDNN on chosen rows (GPU machine, from the repo root, carry .whl):
#   ROWS=256:4096:n,64:512:c bash benchmarks/fa3_ncu_gpu.sh
# Returns in $OUT: the log (ncu version, launch order, ptxas resource lines), the details page of every kernel
# (speed of light, pipes, memory tables, warp stalls, rules), the raw metrics (csv), the per-instruction SASS source
# page of each kernel (warp-stall samples), all gzipped. --clock-control none: the clocks are left alone (METHOD.md).
set -uo pipefail
source benchmarks/device_lib.sh
export PATH=$PATH:/usr/local/cuda/bin
probe_setup /tmp/out ncu_log.txt
ROWS=${ROWS:-256:4096:n,64:512:c}
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # else ncu backs up the whole preallocated pool before every replay pass
REP=/tmp/fa3_ncu
ncu --version | tee -a "$STEP_LOG"
MOSAIC_GPU_DUMP_PTXAS=1 step profile ${LIMIT:-420} 30 ncu --profile-from-start off --clock-control none --set full \
  --import-source no -f -o $REP python3 benchmarks/fa3_ncu_probe.py "$ROWS" ${REGS:+--regs $REGS}
ncu -i $REP.ncu-rep --page details --print-details all 2>&1 | gzip > $OUT/ncu_details.txt.gz
ncu -i $REP.ncu-rep --page raw --csv 2>&1 | gzip > $OUT/ncu_raw.csv.gz
ncu -i $REP.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/ncu_source.csv.gz
ncu -i $REP.ncu-rep --page details --print-summary per-kernel 2>&1 | head -100 >> "$STEP_LOG"
ls -l $OUT $REP.ncu-rep
