#!/usr/bin/env bash
# Device-call chain for the decode/verify kernel and the bf16 identity measurement (repo root, lent GPU):
#   1. kernel  (carry .carry/p00 .whl):  stage GGUF part 00; benchmarks/decode_kernel_gpu.sh (tests, micro-bench,
#              AR decode with/without the kernel); then `stage NN` (carry .carry/pNN) for NN = 01..07
#   2. identity (carry .carry/p08 .carry/b .whl): join the GGUF (device_lib.sh: stage_part, join_gguf);
#              bench_speculative ar,ngram:4 on MT-bench and HumanEval
#              with compute "param" (bf16 operands, decode kernel for T=1 and verify) and "float32";
#              bench_decode smollm-shape in both modes
#   3. draft   (carry .whl): bench_speculative ar,draft:7,draft:4 with the shipped distilled draft model
set -uo pipefail
export SPECJAX_HOME=/root/sj JAX_COMPILATION_CACHE_DIR=/root/jaxcache PYTHONPATH=.:benchmarks:/tmp/site
OUT=${OUT:-/tmp/out}; G=$SPECJAX_HOME/models/smollm2-135m-instruct.gguf; P=/root/sj/prompt_ids.json
source benchmarks/device_lib.sh && install_whl > /dev/null
spec() {  # spec DATASET METHODS TAG [extra flags]
  timeout 280 python3 benchmarks/bench_speculative.py --gguf $G --prompts $P --dataset "$1" --methods "$2" \
    --tag "$3" "${@:4}" 2>&1 | grep -E "^\| (ar|ngram|draft|eagle3|medusa) |Error|error" | tail -6; }
case "$1" in
  kernel)
    stage_part 00
    OUT=$OUT bash benchmarks/decode_kernel_gpu.sh 2>&1 | grep -v "^E  \|^    " | tail -45 ;;
  stage)
    stage_part $2 ;;
  identity)
    join_gguf $G || exit 1
    cp .carry/b/prompt_ids.json $P
    for c in param float32; do for ds in mtbench humaneval; do echo "== $ds $c"; spec $ds ar,ngram:4 _ident --compute $c; done; done
    for c in param float32; do timeout 100 python3 benchmarks/bench_decode.py --models smollm-shape --compute $c --tag _ident \
      2>&1 | grep -E "^\| smollm|Error" ; done
    cp benchmarks/results/*_ident.* $OUT/ 2>/dev/null; ls $OUT ;;
  draft)
    for ds in mtbench humaneval; do echo "== $ds"; spec $ds ar,draft:7,draft:4 _draft; done
    cp benchmarks/results/*_draft.* $OUT/ ;;
esac
