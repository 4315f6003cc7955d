"""Probe (GPU): where a speculative cycle's time goes, SmolLM2 shape, random bf16 weights, B=1.

    PYTHONPATH=.:benchmarks python3 benchmarks/verify_cost_probe.py [--ts 1,8] [--variants default,reduce_linear]
        [--ks 1,3,7] [--drafters eagle3,ngram,eagle3+reduce_linear] [--spec-unroll 1,2] [--ar-rounds 3]
        [--ar-unroll 1,2,4]

1. ``forward`` ms per call of the target at T new tokens against a 512-slot cache (the verify forward is
   T = K+1; T = 1 is an AR step), run N times inside one jit'ed ``fori_loop``: (t(N=160) - t(N=40)) / 120.
   Variants, all from this process: XLA's defaults; ``triton_gemm_off`` (``xla_gpu_enable_triton_gemm=False``,
   cuBLAS for the small GEMMs, as per-jit ``compiler_options``); ``exhaustive_tiling``
   (``xla_gpu_exhaustive_tiling_search=True``: the autotuner tries every Triton GEMM tiling); ``reduce_linear`` (every matmul of <= 16 rows
   traced as a multiply + reduction, the form XLA gives a one-row product, in place of a GEMM); ``sibling_linear`` /
   ``variadic_linear`` (2..16 rows: each row its own one-row reduction over the shared weight, as T sibling reductions
   or as one variadic reduce; benchmarks/NOTES.md item 44; ``variadic2``: the variadic reduce at exactly 2 rows only,
   i.e. the draft model's first step of a cycle; item 50: slower); ``mgpu_linear`` (2..64 rows through
   ``skinny_gemm_probe.skinny_matmul``, a Mosaic GPU kernel with every weight load in flight; item 46).
2. ``cycle`` ms of ``speculative_generate`` with a random EAGLE-3 head (12288-token draft vocabulary):
   it accepts ~nothing; ms/cycle = the difference of a 256- and a 64-token run over the difference of their
   cycle counts. cycle(K) - forward(K+1) is the drafter (K-1 chained head steps + one (K+1)-row update)
   plus the loop's bookkeeping. The n-gram drafter (no model call) gives the loop's bookkeeping plus a cheap
   proposal; ``+reduce_linear`` traces the cycle with ``reduce_linear``, ``+mlp_postscale`` with the MLP's norm of
   several rows as before 2026-12-06 (its 1/rms after the gate/up GEMM, item 48); ``--spec-unroll 2`` runs two
   cycles per ``while_loop`` iteration.
3. Greedy AR ms/token (``generate._generate``, 256- minus 64-token runs) with the sampler as it is (greedy
   fixed on the host, ``SamplingParams.is_greedy``) and with the per-step ``lax.cond`` on the temperature
   that it had before 2026-11-27 (``cond_sample`` patched in), alternating. The results file
   ``verify_cost_probe_H200_2026-11-27_ar.txt`` came from commit 508409e, where ``_generate`` took the
   choice as a static argument instead; the programs compared are the same. ``--ar-unroll 2,4`` adds the
   static-greedy loop with 2 and 4 steps per ``while_loop`` iteration (``_generate(unroll=...)``).
4. ``--drafters draft``: a random distilled draft model of ``--draft-layers`` layers (the shipped one's shape: 2,
   SmolLM2's width, the full 49152-token LM head); its ``forward`` at T=1 and T=2 (a cycle's first draft step
   re-feeds one token) is timed as in 1., and its cycle as in 2.: cycle(K) = one 2-token + (K-1) 1-token draft
   steps + forward(K+1) + bookkeeping (benchmarks/NOTES.md item 40).
Results: ``results/verify_cost_probe_H200_2026-11-27{,_ar,_unroll,_reduce,_tiling}.txt`` (benchmarks/NOTES.md items 18-19);
``results/verify_cost_probe_H200_2026-12-04_draft.txt`` (the draft model, item 40);
``results/verify_cost_probe_H200_2026-12-04_obf16.txt`` (``+o_f32``: the attention's output float32, item 41);
``results/sibling_probe_H200_2026-12-04.txt`` (``sibling_linear`` / ``variadic_linear``, item 44);
``results/verify_cost_probe_H100_2026-12-06_mlp.txt`` (``+mlp_postscale``, item 48);
``results/verify_cost_probe_H100_2026-12-06_variadic2.txt`` (``+variadic2``, item 50)."""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import bench_decode
import common
import skinny_gemm_probe
from specjax import cache as kv
from specjax import layers, model, sampling
from specjax.heads import eagle3
from specjax.speculative import loop, speculative_generate
from specjax.speculative.drafters.draft_model import DraftModel
from specjax.speculative.drafters.eagle3 import Eagle3
from specjax.speculative.drafters.ngram import NGram

gen = importlib.import_module("specjax.generate")  # the module (the package exports a function of that name)
VARIANTS = {"default": None, "triton_gemm_off": {"xla_gpu_enable_triton_gemm": False}, "reduce_linear": None,
            "sibling_linear": None, "variadic_linear": None, "variadic2": None, "mgpu_linear": None,
            "exhaustive_tiling": {"xla_gpu_exhaustive_tiling_search": True}}


def reduce_linear(x_BTI, w_OI, compute_dtype="param"):
    """``layers.linear`` for <= 16 rows as a multiply + reduction over ``in`` (the form XLA gives a one-row
    product), so a verify forward's matmuls become reductions like a decode step's instead of GEMMs."""
    if compute_dtype != "param" or x_BTI.size // x_BTI.shape[-1] > 16:
        return ORIGINAL_LINEAR(x_BTI, w_OI, compute_dtype)
    x = x_BTI.astype(w_OI.dtype).astype(jnp.float32)
    return jnp.sum(x[..., None, :] * w_OI.astype(jnp.float32), axis=-1)


def _rows(x_BTI, w_OI, compute_dtype):
    """The rows of ``x`` as float32 operands rounded to the weight's dtype, or None where ``layers.linear`` stays."""
    rows = x_BTI.size // x_BTI.shape[-1]
    if compute_dtype != "param" or rows == 1 or rows > 16:
        return None
    return x_BTI.astype(w_OI.dtype).astype(jnp.float32).reshape(rows, x_BTI.shape[-1])


def sibling_linear(x_BTI, w_OI, compute_dtype="param"):
    """``layers.linear`` for 2..16 rows as one one-row reduction per row, all over the same weight: sibling
    reductions that XLA may fuse into one multi-output kernel reading each weight once (``reduce_linear``
    re-reads it per row)."""
    x_RI = _rows(x_BTI, w_OI, compute_dtype)
    if x_RI is None:
        return ORIGINAL_LINEAR(x_BTI, w_OI, compute_dtype)
    w = w_OI.astype(jnp.float32)
    out_RO = jnp.stack([jnp.sum(x_RI[r] * w, axis=-1) for r in range(x_RI.shape[0])])
    return out_RO.reshape(x_BTI.shape[:-1] + (w_OI.shape[0],))


def variadic_linear(x_BTI, w_OI, compute_dtype="param"):
    """As ``sibling_linear``, written as ONE variadic reduce (one HLO reduce of R operands, one per row)."""
    x_RI = _rows(x_BTI, w_OI, compute_dtype)
    if x_RI is None:
        return ORIGINAL_LINEAR(x_BTI, w_OI, compute_dtype)
    w = w_OI.astype(jnp.float32)
    R = x_RI.shape[0]
    outs = jax.lax.reduce([x_RI[r] * w for r in range(R)], [jnp.float32(0)] * R,
                          lambda a, b: [u + v for u, v in zip(a, b)], (1,))
    return jnp.stack(outs).reshape(x_BTI.shape[:-1] + (w_OI.shape[0],))


def variadic2_linear(x_BTI, w_OI, compute_dtype="param"):
    """``variadic_linear`` at exactly 2 rows, ``layers.linear`` otherwise: in a draft-model cycle only the draft
    model's first step (``[prev, last]``) has 2 rows, and item 44 measured the variadic form 14 % faster than XLA's
    GEMMs at T=2 (slower from T=3 on)."""
    if x_BTI.size // x_BTI.shape[-1] != 2:
        return ORIGINAL_LINEAR(x_BTI, w_OI, compute_dtype)
    return variadic_linear(x_BTI, w_OI, compute_dtype)


ORIGINAL_LINEAR = layers.linear
LINEARS = {"reduce_linear": reduce_linear, "sibling_linear": sibling_linear, "variadic_linear": variadic_linear,
           "variadic2": variadic2_linear, "mgpu_linear": skinny_gemm_probe.routed_linear(ORIGINAL_LINEAR)}


@contextlib.contextmanager
def patched_o_f32(on: bool):
    """The attention's output float32 in the target and the EAGLE-3 head, as before 2026-12-04 (XLA then runs a
    convert kernel before each o GEMM of T > 1 rows; benchmarks/NOTES.md item 41)."""
    saved = model.operand_dtype, eagle3.operand_dtype
    if on:
        model.operand_dtype = eagle3.operand_dtype = lambda w, compute_dtype="param": jnp.dtype(jnp.float32)
    try:
        yield
    finally:
        model.operand_dtype, eagle3.operand_dtype = saved


ORIGINAL_NORM_SWIGLU = model.norm_swiglu


def postscale_swiglu(x_BTD, w_norm_D, eps, w_gate_up_2FD, w_down_DF, compute_dtype="param"):
    """``layers.norm_swiglu`` before 2026-12-06 (``mlp_postscale``): several rows, too, take the norm's 1/rms after
    the gate/up GEMM (its operand x * w) instead of the norm before it (benchmarks/NOTES.md items 41, 48)."""
    if layers.fold_norm(x_BTD, w_gate_up_2FD, compute_dtype) or layers.one_row(x_BTD):
        return ORIGINAL_NORM_SWIGLU(x_BTD, w_norm_D, eps, w_gate_up_2FD, w_down_DF, compute_dtype)
    return layers.swiglu(w_norm_D * x_BTD, w_gate_up_2FD, w_down_DF, compute_dtype, layers.inv_rms(x_BTD, eps))


@contextlib.contextmanager
def patched_mlp(on: bool):
    """``postscale_swiglu`` in place of the ``norm_swiglu`` that ``model`` imported, while tracing."""
    if on:
        model.norm_swiglu = postscale_swiglu
    try:
        yield
    finally:
        model.norm_swiglu = ORIGINAL_NORM_SWIGLU


@contextlib.contextmanager
def patched_linear(name: str):
    """``LINEARS[name]`` (if ``name`` is one) in place of ``layers.linear`` (and the name ``model`` imported)
    while tracing."""
    if name in LINEARS:
        layers.linear = model.linear = LINEARS[name]
    try:
        yield
    finally:
        layers.linear = model.linear = ORIGINAL_LINEAR


def forward_ms(params, cfg, T: int, options, lo: int = 40, hi: int = 160, repeats: int = 3,
               taps=(2, 15, 27), B: int = 1) -> float:
    cache = kv.set_lengths(kv.init_cache(cfg, B, 512, jnp.bfloat16), jnp.full((B,), 256, jnp.int32))
    toks = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None] + 7, (B, T))

    @functools.partial(jax.jit, compiler_options=options)
    def loop(params, cache, n):
        def body(i, c):
            logits, _, c2 = model.forward(params, cfg, toks, c, taps=taps)
            return kv.set_lengths(c2, c.lengths_B + (logits[0, 0, 0] > 1e9).astype(jnp.int32))
        return jax.lax.fori_loop(0, n, body, cache).lengths_B

    def run(n):
        return common.median_seconds(lambda: jax.block_until_ready(loop(params, cache, jnp.int32(n))), repeats)
    return 1000 * (run(hi) - run(lo)) / (hi - lo)


def cond_sample(key, logits_NV, sp):
    """``sampling.sample`` before 2026-11-27: greedy or not decided on device, per call (a ``lax.cond``)."""
    def argmax(key, logits):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def draw(key, logits):
        return jax.random.categorical(key, sampling.filtered_logits(logits, sp), axis=-1).astype(jnp.int32)
    return jax.lax.cond(sp.temperature <= 0, argmax, draw, key, logits_NV)


def ar_step_ms(params, cfg, prompt, traced_cond: bool, unroll: int = 1, lo=64, hi=256, repeats=3) -> float:
    """Greedy AR ms/token of ``generate._generate``, as it is or with ``cond_sample`` patched in."""
    width, capacity = gen.bucket_shapes([prompt], hi, 0)
    toks, lens = gen.pad_prompts([prompt], width)

    def args(n):
        return (params, jnp.asarray(toks), jnp.asarray(lens), jnp.int32(n), sampling.SamplingParams.make(),
                jax.random.key(0))
    gen.sample = cond_sample if traced_cond else sampling.sample
    jax.clear_caches()  # _generate retraces with the sampler installed
    try:
        compiled = gen._generate.lower(*args(lo), cfg=cfg, capacity=capacity, eos_ids=(), unroll=unroll).compile()
    finally:
        gen.sample = sampling.sample

    def run(n):
        a = args(n)  # built outside the timed call, as before
        return common.median_seconds(lambda: jax.block_until_ready(compiled(*a)), repeats)
    return 1000 * (run(hi) - run(lo)) / (hi - lo)


def unrolled_decode(n: int):
    """``loop.decode_donating`` with n cycles per ``while_loop`` iteration (a cycle of finished rows changes
    nothing but the cycle counter), for the spec-loop variant of the AR unroll question."""
    def _decode(tp, dp, state, sp, *, cfg, drafter, eos_ids):
        def body(s):
            for _ in range(n):
                s = loop._cycle(tp, dp, s, sp, cfg, drafter, eos_ids)
            return s
        return jax.lax.while_loop(lambda s: ~jnp.all(s.done_B), body, state)
    return jax.jit(_decode, static_argnames=("cfg", "drafter", "eos_ids"), donate_argnames=("state",))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ks", default="3,7")
    ap.add_argument("--ts", default="1,8")
    ap.add_argument("--variants", default="default,triton_gemm_off", help=f"forward variants: {', '.join(VARIANTS)}")
    ap.add_argument("--drafters", default="eagle3", help="cycles with these drafters (eagle3, ngram, draft; "
                    "a suffix +reduce_linear traces them with reduce_linear, +o_f32 with the attention's "
                    "output float32 as before 2026-12-04, +mlp_postscale with the MLP norm as before 2026-12-06)")
    ap.add_argument("--draft-layers", type=int, default=2, help="layers of the random draft model (--drafters draft)")
    ap.add_argument("--spec-unroll", default="1", help="cycles with these cycles per while iteration")
    ap.add_argument("--ar-rounds", type=int, default=2, help="alternating rounds of AR with a static / a traced greedy")
    ap.add_argument("--ar-unroll", default="1", help="also AR (static greedy) with these steps per while iteration")
    args = ap.parse_args()
    cfg = bench_decode.SMOLLM2_SHAPE
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    h = common.header()
    print(f"{h['device_kind']}, jax {h['jax']}, {h['date']}: {h['command']}", flush=True)
    print("| what | T or K | variant | ms | wall s |\n|---|---|---|---|---|", flush=True)
    variants = {k: v for k, v in VARIANTS.items() if k in args.variants.split(",")}
    for T in [int(t) for t in args.ts.split(",") if t]:
        for name, opts in variants.items():
            t0 = time.time()
            with patched_linear(name):
                ms = forward_ms(params, cfg, T, opts)
            print(f"| forward | T={T} | {name} | {ms:.4f} | {time.time() - t0:.0f} |", flush=True)
    prompt = [np.random.default_rng(0).integers(10, cfg.vocab_size - 10, 128).tolist()]
    ar_variants = [(True, 1, "lax.cond greedy"), (False, 1, "static greedy")] + [
        (False, u, f"static greedy, unroll {u}") for u in map(int, args.ar_unroll.split(",")) if u != 1]
    for _ in range(args.ar_rounds):
        for cond, unroll, name in ar_variants:
            t0 = time.time()
            print(f"| AR step | T=1 | {name} | {ar_step_ms(params, cfg, prompt[0], cond, unroll):.4f} | "
                  f"{time.time() - t0:.0f} |", flush=True)
    ecfg = eagle3.Eagle3Config(target=cfg, draft_vocab_size=12288)
    dp = {"params": eagle3.init_params(ecfg, jax.random.key(1), dtype=jnp.bfloat16),
          "draft_ids": jnp.arange(12288, dtype=jnp.int32)}
    dcfg = cfg.replace(n_layers=args.draft_layers)
    drafters = {"eagle3": (Eagle3(ecfg), dp), "ngram": (NGram(), None),
                "draft": (DraftModel(dcfg), model.init_params(dcfg, jax.random.key(2), dtype=jnp.bfloat16))}
    if any(d.partition("+")[0] == "draft" for d in args.drafters.split(",")):
        for T in (1, 2):
            for name in [v for v in variants if v == "default" or v in LINEARS]:
                t0 = time.time()
                with patched_linear(name):
                    ms = forward_ms(drafters["draft"][1], dcfg, T, None, taps=())
                print(f"| draft model forward ({args.draft_layers} layers) | T={T} | {name} | {ms:.4f} | "
                      f"{time.time() - t0:.0f} |", flush=True)
    original = loop.decode_donating
    for name, K, u in [(d, int(k), int(u)) for u in args.spec_unroll.split(",") for d in args.drafters.split(",")
                       if d for k in args.ks.split(",") if k]:
        t0 = time.time()
        base, _, patch = name.partition("+")  # "eagle3+reduce_linear" -> "eagle3", "reduce_linear"
        if base not in drafters or patch not in ("", "o_f32", "mlp_postscale", *LINEARS):
            raise SystemExit(f"unknown --drafters entry {name!r}: expected eagle3, ngram or draft, "
                             f"optionally +o_f32, +mlp_postscale or +one of {', '.join(LINEARS)}")
        drafter, d_params = drafters[base]
        loop.decode_donating = original if u == 1 else unrolled_decode(u)
        name = name if u == 1 else f"{name} unroll {u}"
        jax.clear_caches()  # retrace with (or without) the patched linear
        with patched_linear(patch), patched_o_f32(patch == "o_f32"), patched_mlp(patch == "mlp_postscale"):
            runs = {n: [speculative_generate(params, cfg, prompt, drafter, d_params, num_draft=K, max_new_tokens=n,
                                             eos_token_ids=(), capacity=512) for _ in range(4)][1:] for n in (64, 256)}
        cycles = {n: int(r[0].stats.cycles_B.sum()) for n, r in runs.items()}
        secs = {n: float(np.median([x.seconds for x in r])) for n, r in runs.items()}
        ms = 1000 * (secs[256] - secs[64]) / (cycles[256] - cycles[64])
        tau = (256 - 64) / (cycles[256] - cycles[64])
        print(f"| {name} cycle (tokens/cycle {tau:.3f}) | K={K} | default | {ms:.4f} | {time.time() - t0:.0f} |", flush=True)
    loop.decode_donating = original


if __name__ == "__main__":
    main()
