#!/usr/bin/env bash
# The device-call chain that trains, ships and measures the SmolLM2 heads (run from the repo root on the
# lent GPU machine; each step is one `run` call, the next issued within the 30 s the machine stays warm).
# The GGUF travels in nine 12 MB parts (benchmarks/device_lib.sh: stage_part, join_gguf), or in two 50 MB parts A
# and B when the working tree is ~12 MB (the shipped safetensors moved out of it for those two calls; session 16).
# A bench of the shipped drafters: three 33 MB parts, the tree at ~12 MB (EAGLE-3 / draft safetensors and the SmolLM2
# logit fixtures moved out; the bench call carries them back in .carry/; NOTES item 40's bench runbook).
#   1. stage NN (carry .carry/pNN), NN = 00..07 (or A): copy that part outside the repo (/root/stage); a stage call may
#      also carry .carry/e and/or .carry/d (the shipped EAGLE-3 / draft model.safetensors moved out of the tree), kept
#      on the machine and put back by every later call (restore_shipped)
#   2. train1 (carry .carry/p08 (or .carry/pB) .carry/b .whl): join and check the GGUF, corpus + EAGLE-3  (logs to $OUT;
#      and the artifacts exported so far, bundled: a stage cut by --time-budget exports too, and a machine lost
#      before train2 loses its checkpoint; NOTES item 40)
#   3. train2 (carry .whl): the rest of the stages named in ONLY; bundle the artifacts to $OUT
#   (train1 / train2: INIT_EAGLE3=shipped fine-tunes the shipped EAGLE-3 head instead of a random start, INIT_DRAFT=shipped
#   the shipped draft model (its draft vocabulary exported with it) instead of the truncated target, CORPUS_SEED=N
#   builds a corpus of another seed: new Magpie queries and samples; all three must be the same in train1 and train2;
#   TEACHER_CACHE=1 distills the draft model from the target's hidden states computed once: --teacher-cache)
#   A corpus made on one machine can train on another: CORPUS_OUT=1 returns its finished pieces (training/parts.py)
#   as corpus.tar.part*; carried back in .carry/corpus/, train1 resumes the corpus from them.
#   4. bench (carry .carry/p08 .carry/b .whl; the GGUF joined already, unless the machine is fresh): bench_speculative with the trained artifacts,
#      METHODS (e.g. ar,eagle3:7,eagle3:t31), DATASETS (default "humaneval mtbench"), LIMIT prompts each (0 = all);
#      NEW_HEAD=FOLDER keeps the shipped heads and adds FOLDER as method `new` (METHODS=ar,eagle3:7,new:7);
#      PAD=0 times requests at the library's default prompt widths (bench_speculative.py --pad)
#      COMPUTE=float32 runs the target with float32 matmul operands (--compute; the files get _f32compute before TAG)
#      DRAFT_VOCAB=LABEL=full|eagle3|IDS.npy adds the shipped draft model over that vocabulary as method LABEL (--draft-vocab)
# Afterwards, locally: `cat shipped.tar.part* | tar x -C specjax/shipped/smollm2-135m-instruct/`.
set -euo pipefail
# A pinned snapshot of the code (git archive HEAD ... > .carry/h/head.tgz), when carried, replaces the working
# copy's edits in progress, so a run measures committed code.
[ -f .carry/h/head.tgz ] && tar xzf .carry/h/head.tgz
export SPECJAX_HOME=/root/sj JAX_COMPILATION_CACHE_DIR=/root/jaxcache PYTHONPATH=.:benchmarks:/tmp/site
OUT=${OUT:-/tmp/out}
source benchmarks/device_lib.sh  # install_whl, stage_part, join_gguf
stage_gguf() {
  ls .carry/b/mtbench_questions.jsonl .carry/b/humaneval.jsonl > /dev/null \
    || { echo "carry .carry/b with the eval sets (locally: cp ~/.cache/specjax/data/*.jsonl .carry/b/)"; exit 1; }
  join_gguf $SPECJAX_HOME/models/smollm2-135m-instruct.gguf || exit 1
  mkdir -p $SPECJAX_HOME/data && cp .carry/b/*.jsonl $SPECJAX_HOME/data/ 2>/dev/null || true
  if [ -d .carry/corpus ] && [ ! -d /root/train/corpus/parts ]; then  # pieces of a corpus begun on another machine
    mkdir -p /root/train/corpus && cat .carry/corpus/corpus.tar.part* | tar xf - -C /root/train/corpus; fi
}
# The shipped EAGLE-3 / draft weights, when moved out of the working tree to make room for the GGUF's parts: a call that
# carries .carry/e or .carry/d (each holding that model.safetensors) keeps a copy in /root/shipped, and every call
# puts the kept copies back into specjax/shipped/ where the tree lacks them (INIT_DRAFT=shipped reads the draft model
# there in train1 and train2; bench measures them).
restore_shipped() {
  local kind short
  for kind in eagle3 draft; do
    short=${kind:0:1}
    if [ -f .carry/$short/model.safetensors ]; then
      mkdir -p /root/shipped/$kind && cp .carry/$short/model.safetensors /root/shipped/$kind/; fi
    if [ -f /root/shipped/$kind/model.safetensors ] && [ ! -f specjax/shipped/smollm2-135m-instruct/$kind/model.safetensors ]; then
      cp /root/shipped/$kind/model.safetensors specjax/shipped/smollm2-135m-instruct/$kind/; fi
  done
}
corpus_out() {
  [ -n "${CORPUS_OUT:-}" ] && [ -d /root/train/corpus/parts ] || return 0
  tar cf - -C /root/train/corpus parts | split -b 15000000 -d -a 1 - $OUT/corpus.tar.part; ls -l $OUT
}
ONLY=${ONLY:-eagle3}
case "$1" in
  stage)
    stage_part $2; restore_shipped ;;
  train1)
    install_whl; stage_gguf; restore_shipped
    timeout "${2:-585}" python3 -m training.train_smollm2 --preset ${PRESET:-h100} --out /root/train --only $ONLY --time-budget ${BUDGET:-540} ${STEPS:+--steps $STEPS} \
      ${INIT_EAGLE3:+--init-eagle3 $INIT_EAGLE3} ${INIT_DRAFT:+--init-draft $INIT_DRAFT} ${CORPUS_SEED:+--corpus-seed $CORPUS_SEED} ${TEACHER_CACHE:+--teacher-cache} --bundle $OUT 2>&1 | tr '\r' '\n' | grep -v "it/s]$" | tee $OUT/train1.log | tail -40 \
      || echo "train1: exit status $? (124: the time limit)"  # the corpus pieces still go back
    corpus_out ;;
  train2)
    install_whl; restore_shipped
    timeout "${2:-585}" python3 -m training.train_smollm2 --preset ${PRESET:-h100} --out /root/train --time-budget ${BUDGET:-540} \
      --only $ONLY ${STEPS:+--steps $STEPS} ${INIT_EAGLE3:+--init-eagle3 $INIT_EAGLE3} ${INIT_DRAFT:+--init-draft $INIT_DRAFT} ${CORPUS_SEED:+--corpus-seed $CORPUS_SEED} ${TEACHER_CACHE:+--teacher-cache} \
      --bundle $OUT 2>&1 | tr '\r' '\n' | grep -v "it/s]$" | tee $OUT/train2.log | tail -40 \
      || echo "train2: exit status $? (124: the time limit)"  # the corpus pieces still go back
    corpus_out ;;
  bench)
    install_whl; stage_gguf; restore_shipped
    for k in eagle3 medusa draft; do [ -z "${NEW_HEAD:-}" ] && [ -d /root/train/export/$k ] || continue  # else the shipped one
      rm -rf specjax/shipped/smollm2-135m-instruct/$k; cp -r /root/train/export/$k specjax/shipped/smollm2-135m-instruct/$k; done
    G=$SPECJAX_HOME/models/smollm2-135m-instruct.gguf
    for ds in ${DATASETS:-humaneval mtbench}; do
      timeout "${2:-280}" python3 benchmarks/bench_speculative.py --gguf $G --prompts .carry/b/prompt_ids.json \
        --dataset $ds --methods "${METHODS:-ar,eagle3:7,eagle3:t31,draft:7,medusa:4}" --tag ${TAG:-_heads} --limit ${LIMIT:-0} \
        ${NEW_HEAD:+--head new=$NEW_HEAD} ${DRAFT_VOCAB:+--draft-vocab $DRAFT_VOCAB} ${PAD:+--pad $PAD} ${COMPUTE:+--compute $COMPUTE} 2>&1 | grep -v "^{" | tail -12
    done
    cp benchmarks/results/spec_*${TAG:-_heads}.* $OUT/ ;;
esac
