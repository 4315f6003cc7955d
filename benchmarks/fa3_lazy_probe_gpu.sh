#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (gguf, pytest-xdist,
# execnet):
#   bash benchmarks/fa3_lazy_probe_gpu.sh                          # v26: the bf16 rows, then the GPU tests -k lazy
#   DTYPE=float8_e4m3fn PTXAS=1 PROBE_S=55 TESTS_S=80 TESTS_K=fp8_lazy bash benchmarks/fa3_lazy_probe_gpu.sh
#        # v27: ptxas' report, the FP8 rows, the FP8 lazy GPU tests (in the test's first form, NOTES v27)
# lazy_rescale (label suffix /l1; FA4's conditional rescaling): a row's running max moves only when a block's
# scores pass it by more than 2^8, and a warp whose 16 rows all keep theirs skips O's multiply. Every row of the FA3
# table in DTYPE (bfloat16 or float8_e4m3fn; for float8 `default` is fp8_config), each row's pick against the same
# pick with /l1, both twice, alternated; then (TESTS_S > 0) the GPU tests -k TESTS_K (default: lazy, every TUNED
# config with it against the float32 reference). PTXAS=1 first prints ptxas' register and spill report of the bf16
# pick with and without /l1 at hd 64 / 256, 2k / 4k keys, both masks.
# Log: $OUT/fa3_lazy_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3lazy_out fa3_lazy_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
P="python3 benchmarks/fa3_configs_probe.py"
A="default,default/l1,default,default/l1"
L=${PROBE_S:-75}
DTYPE=${DTYPE:-bfloat16}
if [ "${PTXAS:-0}" = 1 ]; then
  step ptxas 90 60 env MOSAIC_GPU_DUMP_PTXAS=1 bash -c "$P 64:2048:n,64:2048:c,256:4096:n,256:4096:c \
    default,default/l1 --new-only --iters 5 2>&1 | grep -i -E 'spill|registers|TFLOPS|label|default'"
fi
for m in n c; do  # ran as hd64n, hd128n, hd256n, hd64c, hd128c, hd256c
  for hd in 64 128 256; do
    step hd$hd$m $L 40 $P $(printf "$hd:%s:$m," 512 1024 2048 4096 8192 16384 | sed 's/,$//') $A --new-only \
      --iters 40 --dtype "$DTYPE"
  done
done
[ "${TESTS_S:-150}" -gt 0 ] && step gpu_tests "${TESTS_S:-150}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py \
  -q -rfEs -p no:cacheprovider --tb=short -n 4 -k "${TESTS_K:-lazy}"
true
