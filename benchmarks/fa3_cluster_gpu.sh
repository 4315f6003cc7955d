#!/usr/bin/env bash
# One device call (<= 10 min), from the repo root, carrying .whl (gguf, pytest-xdist, execnet):
#   bash benchmarks/fa3_cluster_gpu.sh
# NOTES v19: TuningConfig(cluster=2), FA3's 2-CTA cluster for hd >= 128 non-causal (K/V TMA-multicast to the CTAs
# of a q-tile pair, slots freed through cluster barriers). A smoke test first (a deadlock would show there, under
# a short limit), then each non-causal hd 128 / 256 row's default against the same config with cluster=2, cuDNN
# beside, static masks, bf16, one process; then the cluster GPU tests. Log: $OUT/fa3_cluster_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/fa3cluster_out fa3_cluster_log.txt
step smoke 150 15 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs -p no:cacheprovider --tb=short \
  -k "test_gpu_cluster_matches and (hd128-kv192 or hd256-kv64) and none"
ROWS=${ROWS:-256:512:n,256:1024:n,256:2048:n,256:4096:n,256:8192:n,256:16384:n,128:512:n,128:1024:n,128:2048:n,128:4096:n,128:8192:n,128:16384:n}
step probe "${PROBE_S:-260}" 60 python3 benchmarks/fa3_configs_probe.py "$ROWS" "${CONFIGS:-default,default/k2}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step gpu_tests "${TESTS_S:-150}" 25 python3 -m pytest -m gpu tests/test_flash_attention.py -q -rfEs -p no:cacheprovider \
  --tb=short -n 4 -k "${TESTS_K:-cluster}"
true
