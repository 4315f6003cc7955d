#!/usr/bin/env bash
# The device-call chain that trains, ships and measures the SmolLM2 heads (run from the repo root on the
# lent GPU machine; each step is one `run` call, the next issued within the 30 s the machine stays warm).
#   1. part1 (carry .carry/a):  stage GGUF part 1 outside the repo, run the GPU test suite meanwhile
#   2. train1 (carry .carry/b .whl): join the GGUF, corpus + EAGLE-3  (logs to $OUT)
#   3. train2 (carry .whl): EAGLE-3 remainder, Medusa, draft model; bundle the artifacts to $OUT
#   4. bench (carry .carry/b .whl): bench_speculative with the trained artifacts, K=7 chains, all prompts
# Locally: `split -b 50000000 -d GGUF .carry/a/smol.part` (part01 moved to .carry/b with the jsonl data and
# prompt_ids.json), afterwards `cat shipped.tar.part* | tar x -C specjax/shipped/smollm2-135m-instruct/`.
set -euo pipefail
# A pinned snapshot of the code (git archive HEAD ... > .carry/h/head.tgz), when carried, replaces the working
# copy's edits in progress, so a run measures committed code.
[ -f .carry/h/head.tgz ] && tar xzf .carry/h/head.tgz
export SPECJAX_HOME=/root/sj JAX_COMPILATION_CACHE_DIR=/root/jaxcache PYTHONPATH=.:benchmarks:/tmp/site
OUT=${OUT:-/tmp/out}
source benchmarks/device_lib.sh  # install_whl
stage_gguf() {
  mkdir -p $SPECJAX_HOME/models $SPECJAX_HOME/data
  [ -f $SPECJAX_HOME/models/smollm2-135m-instruct.gguf ] || {
    cat /root/stage/smol.part00 .carry/b/smol.part01 > $SPECJAX_HOME/models/smollm2-135m-instruct.gguf; }
  cp .carry/b/*.jsonl $SPECJAX_HOME/data/ 2>/dev/null || true
  sha256sum $SPECJAX_HOME/models/smollm2-135m-instruct.gguf
}
case "$1" in
  part1)
    mkdir -p /root/stage && cp .carry/a/smol.part00 /root/stage/ && install_whl
    nvidia-smi --query-gpu=name,memory.total --format=csv
    timeout "${2:-300}" python3 -m pytest -m gpu tests/test_flash_attention.py -q -rs 2>&1 | tail -25 | tee $OUT/gpu_tests.txt ;;
  train1)
    install_whl; stage_gguf
    timeout "${2:-585}" python3 -m training.train_smollm2 --preset h100 --out /root/train --only eagle3 --time-budget 540 \
      2>&1 | tr '\r' '\n' | grep -v "it/s]$" | tee $OUT/train1.log | tail -40 ;;
  train2)
    install_whl
    timeout "${2:-585}" python3 -m training.train_smollm2 --preset h100 --out /root/train --time-budget 540 \
      --only eagle3,medusa,draft --bundle $OUT 2>&1 | tr '\r' '\n' | grep -v "it/s]$" | tee $OUT/train2.log | tail -40 ;;
  bench)
    install_whl
    for k in eagle3 medusa draft; do rm -rf specjax/shipped/smollm2-135m-instruct/$k; mkdir -p specjax/shipped/smollm2-135m-instruct
      cp -r /root/train/export/$k specjax/shipped/smollm2-135m-instruct/$k; done
    G=$SPECJAX_HOME/models/smollm2-135m-instruct.gguf
    for ds in humaneval mtbench; do
      timeout "${2:-280}" python3 benchmarks/bench_speculative.py --gguf $G --prompts .carry/b/prompt_ids.json \
        --dataset $ds --methods "${METHODS:-ar,eagle3:7,draft:7,medusa:4}" --tag _heads 2>&1 | grep -v "^{" | tail -12
    done
    cp benchmarks/results/spec_*_heads.* $OUT/ ;;
esac
