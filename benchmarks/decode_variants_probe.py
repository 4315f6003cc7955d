"""Probe (GPU): end-to-end AR decode ms/token of the SmolLM2 shape (random bf16 weights, the
bench_decode.py measurement) under decode-kernel config variants and layer variants, all in one process
(caches cleared between variants), so their ratios come from one run on one card.

    PYTHONPATH=.:benchmarks python3 benchmarks/decode_variants_probe.py [VARIANT ...] [--batches 1,8]
        [--shapes smollm2,smollm2-360m,llama-1b] [--busy]

A variant is ``default``, comma-joined TuningConfig overrides on top of ``default_config``, e.g.
``num_stages=1`` or ``block_k=32,num_warps=2``, or a layer variant: ``+nofold`` (one-row steps compute
each RMSNorm's statistic in a reduction kernel of its own, as before 2026-11-27 session 12, instead of
inside the next matmul's reduction, ``layers.linear_sumsq``), ``+fold_mlp`` / ``+fold_attn`` (only the MLP /
attention norm folded), ``+fold_all`` (whatever the model width; ``layers.FOLD_MAX_IN`` was an 8 MiB weight-size
bound, ``FOLD_MAX_BYTES``, when ``results/decode_probe_H200_2026-11-27_foldsize.txt`` was measured) or
``+mlp_copies1`` (one sum-of-squares row appended to the gate/up reduction, not ``layers.MLP_SUMSQ_COPIES``).
``--shapes`` picks random-weight model shapes (``SHAPES``; default the SmolLM2-135M shape). The norm-fold
results: ``results/decode_probe_H200_2026-11-27_{normfold_copies1,normfold,foldsize}.txt`` (benchmarks/NOTES.md
item 20; in the first two the variants patched a ``one_row`` test instead of ``fold_norm``, the same programs).
(Commits 7f0cd44-ba1ffb5 also had ``+mlp=...`` layer variants; the winner, the MLP norm's 1/rms after the
gate/up matmul, is now ``layers.norm_swiglu``.)
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
from specjax import layers, model
from specjax.generate import generate

ORIG_DEFAULT = da.default_config
ORIG_FOLD, ORIG_COPIES, ORIG_MAX = layers.fold_norm, layers.MLP_SUMSQ_COPIES, layers.FOLD_MAX_IN
NEVER = lambda *a, **k: False
# variant -> (model.fold_norm: the attention norm, layers.fold_norm: the MLP norm, FOLD_MAX_IN, MLP copies)
LAYER_VARIANTS = {"+nofold": (ORIG_FOLD, ORIG_FOLD, -1, ORIG_COPIES),  # as bench_decode.set_fold(False)
                  "+fold_mlp": (NEVER, ORIG_FOLD, ORIG_MAX, ORIG_COPIES),
                  "+fold_attn": (ORIG_FOLD, NEVER, ORIG_MAX, ORIG_COPIES),
                  "+fold_all": (ORIG_FOLD, ORIG_FOLD, float("inf"), ORIG_COPIES),
                  "+mlp_copies1": (ORIG_FOLD, ORIG_FOLD, ORIG_MAX, 1)}
SHAPES = {"smollm2": bench_decode.SMOLLM2_SHAPE,
          "smollm2-360m": bench_decode.SMOLLM2_SHAPE.replace(d_model=960, n_heads=15, n_kv_heads=5, ffn_dim=2560,
                                                             n_layers=32),
          "llama-1b": bench_decode.SMOLLM2_SHAPE.replace(d_model=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                                                         n_layers=16, vocab_size=128256, tie_embeddings=True)}


def apply(variant: str):
    """Install the variant's default_config (the original first) or layer variant and clear JAX's
    compilation caches."""
    da.default_config = ORIG_DEFAULT
    model.fold_norm, layers.fold_norm, layers.FOLD_MAX_IN, layers.MLP_SUMSQ_COPIES = LAYER_VARIANTS.get(
        variant, (ORIG_FOLD, ORIG_FOLD, ORIG_MAX, ORIG_COPIES))
    if variant not in LAYER_VARIANTS and variant != "default":
        kw = {k: int(v) for k, v in (p.split("=") for p in variant.split(","))}
        da.default_config = lambda *a: dataclasses.replace(ORIG_DEFAULT(*a), **kw)
    jax.clear_caches()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=["default"])
    ap.add_argument("--batches", default="1")
    ap.add_argument("--shapes", default="smollm2", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", action="store_true", help="also kernels and GPU-busy us per decode step (traced)")
    args = ap.parse_args()
    h = common.header()
    print(f"{h['device_kind']}, jax {h['jax']}, {h['date']}: {h['command']}")
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; ms/token = (t(256) - t(64)) / 192 new tokens, "
          f"median of {args.repeats} runs each; kernels and busy us per step the same difference, traced")
    print("| shape | variant | B | ms/token | kernels/step | GPU busy us/step | config | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        cfg = SHAPES[shape]
        params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
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
                print(f"| {shape} | {v} | {b} | {ms:.3f} | {kernels:.1f} | {busy:.1f} | {c} | {time.time() - t0:.0f} |",
                      flush=True)
        del params


if __name__ == "__main__":
    main()
