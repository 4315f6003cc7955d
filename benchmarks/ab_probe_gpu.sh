#!/usr/bin/env bash
# One device call (<= 10 min) comparing code versions in alternating processes of one call, from the repo root:
#   AB="old:.carry/ab/old silu:.carry/ab/silu" ROUNDS=2 bash benchmarks/ab_probe_gpu.sh
# Each AB entry LABEL:DIR is this tree with DIR's files (same relative paths) copied over it, in /tmp/ab_LABEL;
# "new" is this tree. Per round, each version runs `decode_variants_probe.py default --busy` in its own process
# (ms/token, kernels and GPU-busy us per SmolLM2 decode step; benchmarks/NOTES.md item 13 on why busy time).
# Then, on the new code: the GPU tests in TESTS (test files; TESTS_K a -k filter; unset skips them) and,
# unless SKIP_PROFILE, the
# timeline profile. Everything goes to $OUT/ab_log.txt.
set -uo pipefail
source benchmarks/device_lib.sh  # probe_setup, step
probe_setup /tmp/ab_out ab_log.txt
ROOT=$PWD
declare -A DIRS=([new]=$ROOT)
LABELS=(new)
for entry in ${AB:-}; do
  label=${entry%%:*} src=${entry#*:}
  rm -rf "/tmp/ab_$label" && cp -r "$ROOT" "/tmp/ab_$label" && cp -r "$src"/. "/tmp/ab_$label"/
  DIRS[$label]=/tmp/ab_$label
  LABELS+=("$label")
done
for round in $(seq "${ROUNDS:-2}"); do
  for label in "${LABELS[@]}"; do
    (cd "${DIRS[$label]}" && step "${label}_r$round" 90 3 python3 benchmarks/decode_variants_probe.py default \
      --repeats "${REPEATS:-5}" --busy)
  done
done
[ -n "${TESTS:-}" ] && step gpu_tests "${TESTS_S:-240}" 12 python3 -m pytest -m gpu $TESTS -q -rfEs \
  -p no:cacheprovider --tb=short ${TESTS_K:+-k "$TESTS_K"}
[ -z "${SKIP_PROFILE:-}" ] && step profile 90 3 python3 benchmarks/profile_decode.py --timeline 40
true
