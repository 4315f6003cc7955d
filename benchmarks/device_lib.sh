# Sourced (from the repo root) by the device-call scripts: decode_kernel_gpu.sh, fused_gpu.sh, fa3_bwd_gpu.sh,
# device_heads.sh, device_identity.sh, decode_probe_gpu.sh, ab_probe_gpu.sh, fa3_ncu_gpu.sh,
# fa3_onestage_gpu.sh, fa3_turns_gpu.sh, fa3_turns2_gpu.sh, fa3_turns_final_gpu.sh, fa3_prefetch*_gpu.sh, fa3_bounds_gpu.sh,
# fa3_rounds_gpu.sh, fa3_static_gpu.sh, fa3_late_gpu.sh, fa3_produce_gpu.sh,
# fa3_retune_gpu.sh, fa3_snake_gpu.sh, fa3_h100_gpu.sh, fa3_h100_probe_gpu.sh, fa3_balanced_probe_gpu.sh,
# fa3_h100_rows_probe_gpu.sh, fa3_h100_rows2_probe_gpu.sh, fa3_h100_hd256_probe_gpu.sh,
# fa3_h100_deep_probe_gpu.sh, fa3_lazy_probe_gpu.sh,
# fa3_branch_probe_gpu.sh, fa3_fp8_table_gpu.sh, fa3_racecheck_gpu.sh,
# skinny_gemm_gpu.sh, xla_tiling_gpu.sh,
# gpu_tests_gpu.sh, fa3_sustained_gpu.sh. The helpers
# they share.

# The carried pure-Python wheels (.whl/, e.g. gguf) into /tmp/site, which the scripts put on PYTHONPATH. The FA3
# scripts that run GPU tests with `-n 4` also need pytest-xdist there:
#   pip download --no-deps -d .whl gguf==0.19.0 pytest-xdist==3.8.0 execnet==2.1.2
install_whl() {
  [ -d .whl ] || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl 2>&1 | tail -2 || true  # never stops a `set -e` script
}

# probe_setup DEFAULT_OUT LOG_NAME: the common start of the probe scripts (decode_probe_gpu.sh, ab_probe_gpu.sh):
# Python paths, $OUT (DEFAULT_OUT unless set), every step's output appended to $OUT/LOG_NAME, the GPU's name
# first in it, the carried wheels installed.
probe_setup() {
  export PYTHONPATH=.:benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
  OUT=${OUT:-$1}
  mkdir -p "$OUT"
  export STEP_LOG=$OUT/$2
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$STEP_LOG"
  install_whl
}

# step NAME SECONDS TAIL_LINES CMD...: run CMD under a time limit, print a status line and the tail of its
# output (JAX's deprecation warnings left out). The whole output goes to $OUT/NAME.txt, or, when STEP_LOG
# names a file, is appended to it with the command and the status (one file: $OUT hands back 8 at most).
# A failing or timed-out step does not stop the next one.
step() {
  local name=$1 limit=$2 lines=$3; shift 3
  local t0=$SECONDS raw=/tmp/step_$name.txt
  timeout "$limit" "$@" > "$raw" 2>&1
  local rc=$?
  local status="== $name: rc=$rc, $((SECONDS - t0)) s (rc 124 = timed out after ${limit} s)"
  if [ -n "${STEP_LOG:-}" ]; then
    { echo "== $name: $*"; grep -v -i "deprecat" "$raw"; echo "$status"; } >> "$STEP_LOG"
  else
    cp "$raw" "$OUT/$name.txt"
  fi
  echo "$status"
  grep -v -i "deprecat" "$raw" | tail -n "$lines"
}

# The SmolLM2 GGUF (98 MB) cannot travel in one call (64 MiB with the ~50 MB working tree). Locally:
# `split -b 12000000 -d -a 2 GGUF smol.part` and part NN into .carry/pNN/ (ignored; 00-08; 16 MB parts plus the
# ~51 MB working tree passed 64 MiB). One call per part but
# the last runs `stage_part NN` (carry .carry/pNN), copying it outside the repo; the call that needs the model
# carries the last part and runs `join_gguf DEST`, which joins the staged parts and the carried one and checks
# the sha256.
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
stage_part() {
  mkdir -p /root/stage && cp ".carry/p$1/smol.part$1" /root/stage/ && ls -l /root/stage
}
join_gguf() {
  mkdir -p "$(dirname "$1")"
  # the carried part joins the staged ones (earlier calls' .carry/pNN may still lie in the repo there: same files)
  # (a call may carry no part when all were staged: the tree plus a 25 MB part leaves no room for other carries)
  [ -f "$1" ] || { mkdir -p /root/stage && { cp .carry/p*/smol.part* /root/stage/ 2>/dev/null || true; } \
    && cat /root/stage/smol.part* > "$1"; }
  echo "$GGUF_SHA256  $1" | sha256sum -c - || { rm -f "$1"; return 1; }
}
