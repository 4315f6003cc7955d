"""Probe (GPU): the one-launch decoder layer (pallas_kernels/decode_layer.py) on the SmolLM2-135M shape,
bf16, B=1, a 512-slot cache: its error against the XLA reference (one launch and phase by phase),
and us per layer in a chain of 30 layers in one jit (as a decode step runs them) for config
variants, each phase alone (phase by phase, no barriers), and the barriers alone (phases emptied).

    PYTHONPATH=.:benchmarks python3 benchmarks/layer_probe.py [--variants num_warps=8,rows=16 ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

import common
from pallas_kernels import decode_layer as dl

D, H, G, d, F, S, POS, L = 576, 9, 3, 64, 1536, 512, 300, 30


def inputs():
    ks = iter(jax.random.split(jax.random.key(0), 12))
    w = lambda *s: (0.05 * jax.random.normal(next(ks), s, jnp.float32)).astype(jnp.bfloat16)
    lp = dict(attn_norm=1 + w(D), wqkv=w((H + 2 * G) * d, D), wo=w(D, H * d), mlp_norm=1 + w(D),
              w_gate_up=w(2 * F, D), w_down=w(D, F))
    ang = POS * 0.5 ** jnp.arange(d // 2)
    ang = jnp.concatenate([ang, ang])
    k, v = (jax.random.normal(next(ks), (1, S, G, d)).astype(jnp.bfloat16) for _ in range(2))
    return lp, jax.random.normal(next(ks), (D,)), jnp.cos(ang), jnp.sin(ang), jnp.array([POS], jnp.int32), k, v


def timed(f, *a, repeats=30):
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*a))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) / L * 1e6


def chain(args, cfg, phased=False):
    lp, x, cos, sin, pos, k, v = args

    def run(x, k, v):
        flags = jnp.zeros((dl.flags_size(cfg),), jnp.int32)
        for _ in range(L):
            x, k, v, flags = dl.decode_layer(lp, x, cos, sin, pos, k, v, flags, n_heads=H, eps=1e-5, config=cfg,
                                             phased=phased)
        return x
    return timed(jax.jit(run), x, k, v)


def xla_chain(args):
    lp, x, cos, sin, pos, k, v = args

    def run(x, k, v):
        for _ in range(L):
            x, k, v = dl.decode_layer_reference(lp, x, cos, sin, pos, k, v, n_heads=H, eps=1e-5)
        return x
    return timed(jax.jit(run), x, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="*", default=["num_warps=8", "max_splits=1", "max_splits=2", "max_splits=4", "rows=16"])
    a = ap.parse_args()
    h = common.header()
    print(f"{h['device_kind']}, jax {h['jax']}, {h['date']}: {h['command']}")
    args = inputs()
    base = dl.default_config()
    print("dims:", dl.layer_dims(args[0], args[5], H, 1e-5, base))
    ref = jax.jit(lambda *a: dl.decode_layer_reference(*a, n_heads=H, eps=1e-5))(*args)
    flags = jnp.zeros((dl.flags_size(base),), jnp.int32)
    outs = {}
    for name, kw in (("one launch", {}), ("phased", dict(phased=True))):
        o = dl.decode_layer(*args, flags, n_heads=H, eps=1e-5, **kw)
        outs[name] = o
        errs = [float(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32)).max()) for x, y in zip(o[:3], ref)]
        print(f"{name}: max |err| vs reference x {errs[0]:.3g} k {errs[1]:.3g} v {errs[2]:.3g} "
              f"(|x| max {float(jnp.abs(ref[0]).max()):.3g}); flags {sorted(set(np.asarray(o[3]).tolist()))}")
    same = all(np.array_equal(np.asarray(p), np.asarray(q)) for p, q in zip(outs["one launch"][:3], outs["phased"][:3]))
    print("one launch == phased bitwise:", same)
    print(f"us per layer, chain of {L} in one jit (median of 30):")
    print(f"  XLA reference layers: {xla_chain(args):.1f}")
    print(f"  phased (5 launches): {chain(args, base, phased=True):.1f}")
    print(f"  one launch {base}: {chain(args, base):.1f}")
    for v in a.variants:
        kw = {k: int(x) for k, x in (p.split("=") for p in v.split(","))}
        cfg = dataclasses.replace(base, **kw)
        print(f"  one launch {v}: {chain(args, cfg):.1f}")
    run0, load0 = list(dl._RUN), list(dl._LOAD)
    for keep in range(dl.N_PHASES):   # one phase's work, the rest emptied, phase by phase
        dl._RUN[:] = [f if i == keep else (lambda *x: None) for i, f in enumerate(run0)]
        dl._LOAD[:] = [f if i == keep else (lambda *x: None) for i, f in enumerate(load0)]
        jax.clear_caches()
        print(f"  phase {keep} only, one launch with barriers: {chain(args, base):.1f}; "
              f"phased (5 launches, 4 empty): {chain(args, base, phased=True):.1f}")
    dl._RUN[:] = [lambda *x: None] * dl.N_PHASES
    dl._LOAD[:] = [lambda *x: None] * dl.N_PHASES
    jax.clear_caches()
    print(f"  no work (launch + 4 barriers): {chain(args, base):.1f}; 5 empty launches: {chain(args, base, True):.1f}")
    dl._RUN[:], dl._LOAD[:] = run0, load0


if __name__ == "__main__":
    main()
