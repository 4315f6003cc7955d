#!/usr/bin/env bash
# One device call, from the repo root (carry .whl): benchmarks/layer_probe.py, the decode_layer GPU tests, and the
# SmolLM2-shape decode probe with SPECJAX_LAYER_KERNEL=1 then 0. Log: $OUT/log.txt
# (results/layer_kernel_H200_2026-11-27_log.txt).
export PYTHONPATH=.:benchmarks:/tmp/site PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
source benchmarks/device_lib.sh; install_whl
mkdir -p $OUT; export STEP_LOG=$OUT/log.txt
nvidia-smi --query-gpu=name --format=csv,noheader >> $STEP_LOG
step probe 200 40 python3 benchmarks/layer_probe.py
step gpu_tests 150 15 python3 -m pytest -m gpu tests/test_decode_layer.py -q -rfEs -p no:cacheprovider --tb=line --timeout 60 -x
for on in 1 0; do SPECJAX_LAYER_KERNEL=$on step "layer${on}" 100 3 python3 benchmarks/decode_variants_probe.py default --repeats 5 --busy; done
