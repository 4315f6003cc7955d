"""Probe (GPU): end-to-end AR decode ms/token of the SmolLM2 shape (random bf16 weights, the
bench_decode.py measurement) under decode-kernel config variants, all in one process (caches cleared
between variants), so their ratios come from one run on one card.

    PYTHONPATH=.:benchmarks python3 benchmarks/decode_variants_probe.py [VARIANT ...] [--batches 1,8]

A variant is ``default`` or comma-joined TuningConfig overrides on top of ``default_config``, e.g.
``num_stages=1`` or ``block_k=32,num_warps=2``. (Commits 7f0cd44-ba1ffb5 also had ``+mlp=...`` layer
variants; the winner, the MLP norm's 1/rms after the gate/up matmul, is now ``layers.norm_swiglu``.)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time

import jax
import jax.numpy as jnp

import bench_decode
import common
import profile_decode
import pallas_kernels.decode_attention as da
from specjax import model
from specjax.generate import generate

ORIG_DEFAULT = da.default_config


def apply(variant: str):
    """Install the variant's default_config (the original first) and clear JAX's compilation caches."""
    da.default_config = ORIG_DEFAULT
    if variant != "default":
        kw = {k: int(v) for k, v in (p.split("=") for p in variant.split(","))}
        da.default_config = lambda *a: dataclasses.replace(ORIG_DEFAULT(*a), **kw)
    jax.clear_caches()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=["default"])
    ap.add_argument("--batches", default="1")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", action="store_true", help="also kernels and GPU-busy us per decode step (traced)")
    args = ap.parse_args()
    cfg = bench_decode.SMOLLM2_SHAPE
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    h = common.header()
    print(f"{h['device_kind']}, jax {h['jax']}, {h['date']}: {h['command']}")
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; ms/token = (t(256) - t(64)) / 192 new tokens, "
          f"median of {args.repeats} runs each; kernels and busy us per step the same difference, traced")
    print("| variant | B | ms/token | kernels/step | GPU busy us/step | config | wall s |")
    print("|---|---|---|---|---|---|---|")
    for v in args.variants:
        apply(v)
        for b in map(int, args.batches.split(",")):
            t0 = time.time()
            ms = bench_decode.decode_ms_per_token(params, cfg, b, prompt_len=128, n_lo=64, n_hi=256,
                                                  repeats=args.repeats)
            kernels = busy = float("nan")
            if args.busy:
                prompts = [list(range(10, 138))] * b
                ev = {n: profile_decode.gpu_events(lambda: generate(params, cfg, prompts, max_new_tokens=n,
                                                                     eos_token_ids=()))[1] for n in (64, 256)}
                kernels = (len(ev[256]) - len(ev[64])) / 192
                busy = (sum(e.get("dur", 0.0) for e in ev[256]) - sum(e.get("dur", 0.0) for e in ev[64])) / 192
            c = da.default_config(b, cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim)
            print(f"| {v} | {b} | {ms:.3f} | {kernels:.1f} | {busy:.1f} | {c} | {time.time() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
