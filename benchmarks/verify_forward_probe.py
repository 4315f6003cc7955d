"""Probe (GPU): what a verify forward (T = K+1 new tokens) runs that a decode step (T = 1) does not, and
variants of the T > 1 layer that run fewer kernels. SmolLM2 shape, random bf16 weights, B=1, 512-slot cache.

    PYTHONPATH=.:benchmarks python3 benchmarks/verify_forward_probe.py [--ts 1,5,8] [--variants default,qkv_post]
        [--profile 1,5] [--hlo 5] [--rounds 2] [--decode-batch 8]

1. ms per forward at each T and variant, as ``verify_cost_probe.forward_ms`` (N forwards in one jit'ed
   ``fori_loop``, (t(160) - t(40)) / 120), in ``--rounds`` alternating rounds.
2. ``--profile``: GPU kernels per forward at those T (default variant and each other one), by kind, from one
   traced loop of 64 forwards (``profile_decode.gpu_events``).
3. ``--hlo T``: the optimized HLO of one forward at T (default variant) to ``$OUT/verify_forward_T{T}.hlo.txt``.
Variants (T > 1 only; a one-row step keeps its folded path, ``layers.fold_norm``):
  ``qkv_post``  q|k|v = (x * w_norm) @ Wqkv, times 1/rms(x) after the GEMM (as ``layers.norm_swiglu`` does for
                the MLP's one-row step), so the normalised operand is not written by a kernel of its own;
  ``qkv_knorm`` the same GEMM, and 1/rms applied inside the attention kernel (``attend_new_tokens(norm=...)``,
                the folded one-row path's form) from sum(x**2) in one more head;
  ``o_f32``     (all T) the attention's output float32, as before 2026-12-04, so XLA runs a convert kernel
                before each o GEMM at T > 1 (``default`` has the kernel store o in bf16);
  ``mlp_postscale`` the MLP's 1/rms after the gate/up GEMM at T > 1 (its operand x * w), as ``layers.norm_swiglu``
                had it before 2026-12-06 (item 41's ``mlp_prenorm``, the norm before the GEMM, is now the default;
                item 48).
  ``mgpu_linear`` every bf16 matmul of 2-64 rows (padded to a multiple of 8) as
                ``skinny_gemm_probe.skinny_matmul`` (all weight loads in flight at once) instead of XLA's GEMM;
                one-row matmuls unchanged (benchmarks/NOTES.md item 46).
Results: ``results/verify_forward_probe_H200_2026-12-04.txt`` (benchmarks/NOTES.md item 41; its call 1 ran
``qkv_post`` and ``qkv_knorm`` before o was stored in bf16, against a default that had the convert too);
``results/verify_forward_probe_H100_2026-12-06_mlp.txt`` (``mlp_postscale``, ``--decode-batch 8``; item 48).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time

import jax
import jax.numpy as jnp

import bench_decode
import common
import profile_decode
from specjax import attention, model
from specjax import cache as kv
from specjax.layers import fold_norm, inv_rms, linear
from verify_cost_probe import forward_ms, patched_linear, patched_mlp, patched_o_f32

ORIGINAL_BLOCK = model.attention_block


def _block(kind: str):
    def block(lp, cfg, x_BTD, cos, sin, k_BSGd, v_BSGd, start_B, tree=None):
        if fold_norm(x_BTD, lp["wqkv"], cfg.compute_dtype) or "bqkv" in lp or tree is not None:
            return ORIGINAL_BLOCK(lp, cfg, x_BTD, cos, sin, k_BSGd, v_BSGd, start_B, tree)
        B, T, D = x_BTD.shape
        H, G, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv = linear(lp["attn_norm"] * x_BTD, lp["wqkv"], cfg.compute_dtype)
        if kind == "qkv_post":
            qkv = (qkv * inv_rms(x_BTD, cfg.norm_eps)).reshape(B, T, H + 2 * G, d)
            norm = None
        else:
            ss = jnp.sum(x_BTD * x_BTD, axis=-1)[:, :, None, None]
            qkv = jnp.concatenate([qkv.reshape(B, T, H + 2 * G, d), jnp.broadcast_to(ss, (B, T, 1, d))], axis=2)
            norm = (D, cfg.norm_eps)
        o_BTHd, k_BSGd, v_BSGd = attention.attend_new_tokens(  # o as ``model.attention_block`` asks for it
            qkv, k_BSGd, v_BSGd, cos, sin, start_B, H, cfg.compute_dtype, norm=norm,
            out_dtype=model.operand_dtype(lp["wo"], cfg.compute_dtype))
        return linear(o_BTHd.reshape(B, T, H * d), lp["wo"], cfg.compute_dtype), k_BSGd, v_BSGd
    return block


VARIANTS = {"default": None, "qkv_post": _block("qkv_post"), "qkv_knorm": _block("qkv_knorm"), "o_f32": None,
            "mlp_postscale": None, "mgpu_linear": None}


@contextlib.contextmanager
def variant(name: str):
    if VARIANTS[name] is not None:
        model.attention_block = VARIANTS[name]
    try:  # mgpu_linear: verify_cost_probe.LINEARS
        with patched_o_f32(name == "o_f32"), patched_linear(name), patched_mlp(name == "mlp_postscale"):
            yield
    finally:
        model.attention_block = ORIGINAL_BLOCK
        jax.clear_caches()


def half_full_cache(cfg) -> kv.KVCache:
    """A 512-slot bf16 cache filled to 256, as ``verify_cost_probe.forward_ms`` times the forward against."""
    return kv.set_lengths(kv.init_cache(cfg, 1, 512, jnp.bfloat16), jnp.array([256], jnp.int32))


def one_forward(params, cfg, T):
    toks = jnp.arange(T, dtype=jnp.int32)[None] + 7
    return jax.jit(lambda p, c: model.forward(p, cfg, toks, c, taps=(2, 15, 27))[0]), half_full_cache(cfg)


def profile(params, cfg, T: int, n: int = 64) -> tuple[dict, float]:
    cache = half_full_cache(cfg)
    toks = jnp.arange(T, dtype=jnp.int32)[None] + 7

    @jax.jit
    def run(p, c):
        def body(i, c):
            logits, _, c2 = model.forward(p, cfg, toks, c, taps=(2, 15, 27))
            return kv.set_lengths(c2, c.lengths_B + (logits[0, 0, 0] > 1e9).astype(jnp.int32))
        return jax.lax.fori_loop(0, n, body, c).lengths_B
    jax.block_until_ready(run(params, cache))
    _, events = profile_decode.gpu_events(lambda: jax.block_until_ready(run(params, cache)))
    return dict(profile_decode.us_by_kind(events, n)), len(events) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ts", default="1,5,8")
    ap.add_argument("--variants", default="default,qkv_post,qkv_knorm", help=", ".join(VARIANTS))
    ap.add_argument("--profile", default="5", help="T values to trace (kernels per forward)")
    ap.add_argument("--hlo", default="5", help="T values whose optimized HLO is written to $OUT")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--decode-batch", default="", help="also time one-token forwards at these batch sizes > 1 "
                    "(several rows, so the T > 1 variants apply)")
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    for v in names:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}: expected one of {', '.join(VARIANTS)}")
    cfg = bench_decode.SMOLLM2_SHAPE
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    h = common.header()
    print(f"{h['device_kind']}, jax {h['jax']}, {h['date']}: {h['command']}", flush=True)
    out = os.environ.get("OUT", "/tmp")
    for T in [int(t) for t in args.hlo.split(",") if t]:
        fn, cache = one_forward(params, cfg, T)
        text = fn.lower(params, cache).compile().as_text()
        with open(f"{out}/verify_forward_T{T}.hlo.txt", "w") as f:
            f.write(text)
        print(f"optimized HLO at T={T}: {len(text)} chars, {text.count(' fusion(')} fusions, "
              f"{text.count('custom-call(')} custom calls", flush=True)
    for T in [int(t) for t in args.ts.split(",") if int(t) > 1]:
        fn, cache = one_forward(params, cfg.replace(compute_dtype="float32"), T)
        ref = fn(params, cache)  # float32 operands: the variants' bf16 roundings are measured against it
        for name in names:
            with variant(name):
                fn, cache = one_forward(params, cfg, T)
                logits = fn(params, cache)
            err = float(jnp.max(jnp.abs(logits - ref))) / float(jnp.max(jnp.abs(ref)))
            same = float(jnp.mean(jnp.argmax(logits, -1) == jnp.argmax(ref, -1)))
            print(f"T={T} {name}: max |logits - float32| / max |float32| {err:.2e}, argmax agreement {same:.3f}",
                  flush=True)
    print("| what | T | variant | ms | wall s |\n|---|---|---|---|---|", flush=True)
    for r in range(args.rounds):
        for T in [int(t) for t in args.ts.split(",") if t]:
            for name in names if T > 1 else [n for n in names if n in ("default", "o_f32")]:
                t0 = time.time()
                with variant(name):
                    ms = forward_ms(params, cfg, T, None)
                print(f"| forward r{r} | T={T} | {name} | {ms:.4f} | {time.time() - t0:.0f} |", flush=True)
        for B in [int(b) for b in args.decode_batch.split(",") if b]:
            for name in names:
                t0 = time.time()
                with variant(name):
                    ms = forward_ms(params, cfg, 1, None, B=B)
                print(f"| forward r{r} | B={B}, T=1 | {name} | {ms:.4f} | {time.time() - t0:.0f} |", flush=True)
    for T in [int(t) for t in args.profile.split(",") if t]:
        per = {}
        for name in names if T > 1 else [n for n in names if n in ("default", "o_f32")]:
            with variant(name):
                per[name] = profile(params, cfg, T)
        print(f"\nGPU kernels per forward at T={T}: " + ", ".join(
            f"{n} {sum(u.values()):.1f} us in {k:.1f} kernels" for n, (u, k) in per.items()), flush=True)
        kinds = sorted({k for u, _ in per.values() for k in u}, key=lambda k: -per[names[0]][0].get(k, 0))
        print("| kernel kind | " + " | ".join(f"{n} us" for n in per) + " |\n|---" * (len(per) + 1) + "|")
        for k in kinds[:40]:
            print(f"| {k[:80]} | " + " | ".join(f"{u.get(k, 0):.1f}" for u, _ in per.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
