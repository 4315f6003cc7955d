#!/usr/bin/env bash
# One device call (<= 10 min) on an H100 (nvidia-h100-x1), from the repo root, carrying .whl (gguf, pytest-xdist,
# execnet):
#   bash benchmarks/fa3_h100_probe_gpu.sh
# After fa3_h100_gpu.sh's table (2026-12-05: 1.0465x cuDNN, 65 / 72 rows; behind: hd 256 non-causal only): the GPU
# tests of every TUNED config again (that call's run was cut at 150 s), then fa3_configs_probe.py on the H100's
# weakest rows, each row's default timed first and again last (/n132: the same config under another label), so a
# pick the H200 probes fitted is checked against its neighbours on this card. Log: $OUT/fa3_h100_probe_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3h100probe_out fa3_h100_probe_log.txt
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gpu_tests "${TESTS_S:-230}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs \
  -p no:cacheprovider --tb=short -n 8 -k "tuned_configs or static_mask or dispatch or gpu_fp8"
step probe256 "${P256_S:-170}" 40 python3 benchmarks/fa3_configs_probe.py 256:512:n,256:1024:n,256:2048:n,256:16384:n \
  default,64/2/B+O/s1,64/2/P/s1,128/1/P/a1/s1,128/1/G/a1,128/1/B/a1,default/n132 --new-only
step probe128 "${P128_S:-130}" 40 python3 benchmarks/fa3_configs_probe.py 128:2048:n,128:4096:n,128:8192:n \
  default,128/2/P+O,128/2/P/f1,192/2/G,192/2/B,default/n132 --new-only
true
