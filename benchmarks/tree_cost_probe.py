"""Probe (GPU): what a draft-tree cycle costs against a chain's, SmolLM2 shape, random bf16 weights, B=1.

    PYTHONPATH=.:benchmarks python3 benchmarks/tree_cost_probe.py [--sizes 15,31,63] [--cycles eagle3,medusa,draft]
        [--shape smollm2|llama3-8b] [--profile eagle3:15] [--profile-chain K] [--no-rows]

Every piece runs N times inside one jit'ed ``fori_loop`` against a 1024-slot cache filled to 512, and its cost
is (t(N=160) - t(N=40)) / 120 ms:
- ``forward`` of the target over T rows: a chain's (causal, T = K+1) and a tree's (``tree_TT``: the decode kernel's
  tree mode up to 32 rows, XLA's masked attention above), for the shipped heads' fitted trees;
- ``gather_rows``: moving a depth-7 path's K/V into place in all 30 layers (what a tree cycle adds after verify;
  one kernel on Hopper, ``SPECJAX_MOVE_ROWS=0``: XLA's ops; measured on loop-invariant caches, so not in place);
- ``tree_verify``: greedy verification of the tree's rows (argmax + the ancestor check);
- ``medusa propose`` / ``eagle3 propose`` / ``draft propose``: the drafter's proposal alone (random heads; a random
  2-layer draft model of the target's width over a 12288-token draft vocabulary, its fitted trees), chain and tree.
(``--shape llama3-8b``: the forward rows only, 8 vs 32 calls.) Then whole cycles (``speculative_generate``;
a random EAGLE-3 head accepts ~nothing, so its cycle emits one token): ms per
cycle = the difference of a 256- and a 64-token run over the difference of their cycle counts.
``--profile eagle3:15`` traces one 256-token run of the chain (``--profile-chain K`` long, default the drafter's
chain) and of that tree and lists the GPU time per cycle by kernel kind, largest differences first (``--no-rows``
skips the looped pieces).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

import bench_decode
import common
import profile_decode
from specjax import cache as kv
from specjax import config, model, sampling
from specjax.heads import eagle3, medusa, shipped
from specjax.speculative import speculative_generate, verify
from specjax.speculative.drafters.base import Context
from specjax.speculative.drafters.draft_model import DraftModel, restrict_vocab
from specjax.speculative.drafters.eagle3 import Eagle3
from specjax.speculative.drafters.medusa import Medusa
from specjax.speculative.tree import Tree

CAP, FILLED = 1024, 512


LOOP = dict(lo=40, hi=160, repeats=3)


def looped_ms(fn, arg, lo: int, hi: int, repeats: int) -> float:
    """ms per call of ``fn(arg, i, carry) -> carry`` (carry: an int32 scalar that fn must depend on and change;
    ``arg``, e.g. the weights, is passed into the jit, not captured as a constant)."""
    @jax.jit
    def run(arg, n):
        return jax.lax.fori_loop(0, n, functools.partial(fn, arg), jnp.int32(0))

    def t(n):
        return common.median_seconds(lambda: jax.block_until_ready(run(arg, jnp.int32(n))), repeats)
    return 1000 * (t(hi) - t(lo)) / (hi - lo)


def dep(x) -> jax.Array:
    """An int32 0 that depends on x (keeps the loop body from being hoisted or dropped)."""
    return (jnp.sum(x.astype(jnp.float32)) > 1e30).astype(jnp.int32)


def kernels_per_cycle(params, cfg, prompt, d, dp, nd) -> tuple[dict, float]:
    """GPU microseconds per cycle by kernel kind (names without their numeric suffix) and kernels per cycle."""
    run = functools.partial(speculative_generate, params, cfg, prompt, d, dp, num_draft=nd, eos_token_ids=(),
                            capacity=CAP)
    run(max_new_tokens=256)  # compile
    res, events = profile_decode.gpu_events(lambda: run(max_new_tokens=256))
    cycles = int(res.stats.cycles_B.sum())
    return dict(profile_decode.us_by_kind(events, cycles)), len(events) / cycles


def profile(params, cfg, prompt, runs: dict) -> None:
    per = {label: kernels_per_cycle(params, cfg, prompt, *r) for label, r in runs.items()}
    (a, (ua, na)), (b, (ub, nb)) = per.items()
    print(f"\nGPU time per cycle (one traced 256-token run each): {a} {sum(ua.values()):.1f} us in {na:.1f} "
          f"kernels, {b} {sum(ub.values()):.1f} us in {nb:.1f} kernels")
    print(f"| kernel kind | {a} us | {b} us | difference |\n|---|---|---|---|")
    for name in sorted(set(ua) | set(ub), key=lambda x: -abs(ub.get(x, 0) - ua.get(x, 0)))[:30]:
        x, y = ua.get(name, 0), ub.get(name, 0)
        print(f"| {name[:80]} | {x:.1f} | {y:.1f} | {y - x:+.1f} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="15,31,63")
    ap.add_argument("--cycles", default="eagle3,medusa")
    ap.add_argument("--drafters", default="eagle3,medusa,draft", help="whose trees and proposals the rows time")
    ap.add_argument("--smoke", action="store_true", help="2 vs 4 calls, one repeat (a CPU check that it runs)")
    ap.add_argument("--profile", default="", help="e.g. eagle3:15: GPU kernels per cycle, chain vs that tree (a trace)")
    ap.add_argument("--profile-chain", type=int, default=0,
                    help="the profiled chain's K (0: the drafter's chain; the draft model's chain rows too)")
    ap.add_argument("--no-rows", action="store_true", help="skip the looped pieces (forward ... propose)")
    ap.add_argument("--shape", default="smollm2", choices=("smollm2", "llama3-8b"),
                    help="llama3-8b: the forward rows only, for a model whose step reads 15 GB of weights")
    args = ap.parse_args()
    loop_kw = dict(lo=2, hi=4, repeats=1) if args.smoke else LOOP
    if args.shape == "llama3-8b":
        loop_kw = dict(lo=8, hi=32, repeats=3) if not args.smoke else loop_kw
    cfg = bench_decode.SMOLLM2_SHAPE if args.shape == "smollm2" else config.llama3_8b_shape()
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    cache = kv.set_lengths(kv.init_cache(cfg, 1, CAP, jnp.bfloat16), jnp.array([FILLED], jnp.int32))
    trees = {(k, n): Tree.load(shipped.ROOT / "smollm2-135m-instruct" / k / "trees.json", n, k)
             for k in args.drafters.split(",") for n in map(int, args.sizes.split(","))}
    h = common.header()
    print(f"{h['device_kind']}, jax {h['jax']}, {h['date']}: {h['command']}", flush=True)
    print("| what | shape | ms | wall s |\n|---|---|---|---|", flush=True)

    def row(what, shape, fn, arg=None):
        t0 = time.time()
        arg = (params, cache) if arg is None else arg
        print(f"| {what} | {shape} | {looped_ms(fn, arg, **loop_kw):.4f} | {time.time() - t0:.0f} |", flush=True)

    def fwd(T, tree_TT=None):
        toks = jnp.arange(T, dtype=jnp.int32)[None] + 7

        def body(arg, i, c):
            p, kvc = arg
            logits, _, _ = model.forward(p, cfg, toks + c, kvc, taps=(2, 15, 27), tree_TT=tree_TT)
            return c + dep(logits[0, :, :8])
        return body

    if args.no_rows:
        row = lambda *a, **k: None  # noqa: E731
    for T in (1, 8, 16):
        row("forward causal", f"T={T}", fwd(T))
    for (k, n), tree in trees.items():
        row(f"forward tree ({k} fitted)", f"N={n}, T={n + 1}, depth {tree.depth}", fwd(n + 1, tree.ancestors))
    row("forward tree (chain of 15 as a tree)", "T=16", fwd(16, Tree.chain(15).ancestors))
    if args.shape != "smollm2":
        return

    rows = jnp.asarray(Tree.chain(7).path_to[-1])[None]  # 8 rows

    def gather(arg, i, c):
        moved = kv.gather_rows(arg[1], arg[1].lengths_B + c, rows)
        return c + dep(moved.k[0][0, FILLED:FILLED + 8]) + dep(moved.v[-1][0, FILLED:FILLED + 8])
    row("gather_rows (30 layers, k and v)", "8 rows", gather)

    for (k, n), tree in trees.items():
        logits = jax.random.normal(jax.random.key(1), (1, n + 1, cfg.vocab_size), jnp.float32)
        nodes = jnp.zeros((1, n), jnp.int32)

        def tv(arg, i, c, logits=logits, nodes=nodes, tree=tree):
            v = verify.tree_verify(jax.random.key(0), logits + c, nodes, tree, sampling.SamplingParams.make())
            return c + dep(v.tokens_BK1)
        row(f"tree_verify greedy ({k})", f"N={n}", tv)

    mcfg = medusa.MedusaConfig(cfg, num_heads=4)
    mp = jax.tree.map(lambda x: (0.01 * jax.random.normal(jax.random.key(2), x.shape)).astype(jnp.bfloat16),
                      medusa.init_params(mcfg))
    ecfg = eagle3.Eagle3Config(target=cfg, draft_vocab_size=12288)
    ep = {"params": eagle3.init_params(ecfg, jax.random.key(1), dtype=jnp.bfloat16),
          "draft_ids": jnp.arange(12288, dtype=jnp.int32)}
    hcache = kv.set_lengths(eagle3.init_cache(ecfg, 1, CAP, jnp.bfloat16), jnp.array([FILLED], jnp.int32))
    dcfg = dataclasses.replace(cfg, n_layers=2)
    dcfg, ddp = restrict_vocab(dcfg, model.init_params(dcfg, jax.random.key(3), dtype=jnp.bfloat16),
                               np.arange(12288))
    dcache = kv.set_lengths(kv.init_cache(dcfg, 1, CAP, jnp.bfloat16), jnp.array([FILLED], jnp.int32))
    sp = sampling.SamplingParams.make()
    hist = jnp.zeros((1, CAP), jnp.int32)
    drafters = {"medusa": (mp, lambda t: Medusa(mcfg, t), 4), "eagle3": (ep, lambda t: Eagle3(ecfg, t), 7),
                "draft": (ddp, lambda t: DraftModel(dcfg, tree=t), args.profile_chain or 5)}
    for k, (dp, make, chain_k) in [(k, v) for k, v in drafters.items() if k in args.drafters.split(",")]:
        for label, tree in [("chain", None)] + [(f"tree {n}", t) for (kk, n), t in trees.items() if kk == k]:
            d = make(tree)
            K = chain_k if tree is None else tree.num_nodes

            def prop(arg, i, c, d=d, K=K, k=k):
                p, dp, hc = arg
                h_BD = jnp.full((1, cfg.d_model), 1.0, jnp.float32) + c  # not a constant: nothing folds
                state = {"medusa": h_BD, "draft": dcache}.get(k, {"cache": hc, "h_BD": h_BD})
                ctx = Context(hist, jnp.array([FILLED], jnp.int32) + c, jnp.array([5]) + c, jax.random.key(0), sp,
                              num_draft=K)
                prop, _, _ = d.propose(p, dp, state, ctx, None, cfg)
                return c + dep(prop.tokens_BK)
            row(f"{k} propose {label}", f"K={K}", prop, (params, dp, hcache))

    prompt = [np.random.default_rng(0).integers(10, cfg.vocab_size - 10, 128).tolist()]
    if args.profile:
        k, _, n = args.profile.partition(":")
        dp, make, chain_k = drafters[k]
        chain_k = args.profile_chain or chain_k
        profile(params, cfg, prompt, {f"chain {chain_k}": (make(None), dp, chain_k),
                                      f"tree {n}": (make(trees[k, int(n)]), dp, None)})
    for k in [c for c in args.cycles.split(",") if c]:
        dp, make, chain_k = drafters[k]
        for label, tree in [("chain", None)] + [(f"tree {n}", t) for (kk, n), t in trees.items() if kk == k]:
            t0 = time.time()
            d = make(tree)
            nd = chain_k if tree is None else None
            runs = {n: [speculative_generate(params, cfg, prompt, d, dp, num_draft=nd, max_new_tokens=n,
                                             eos_token_ids=(), capacity=CAP) for _ in range(4)][1:] for n in (64, 256)}
            cycles = {n: int(r[0].stats.cycles_B.sum()) for n, r in runs.items()}
            secs = {n: float(np.median([x.seconds for x in r])) for n, r in runs.items()}
            ms = 1000 * (secs[256] - secs[64]) / (cycles[256] - cycles[64])
            print(f"| {k} cycle {label} (tokens/cycle {(256 - 64) / (cycles[256] - cycles[64]):.2f}) | "
                  f"K={chain_k if tree is None else tree.num_nodes} | {ms:.4f} | {time.time() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
