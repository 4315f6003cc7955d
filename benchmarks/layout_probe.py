"""Does the weight layout matter for B=1 decode GEMVs under XLA? ([in, out] vs [out, in])

    python benchmarks/layout_probe.py

Times 30 SmolLM2-shaped layers of the matmul part of a decode step (norm, qkv, wo, gate_up, down;
no attention) in a lax.fori_loop, for both weight layouts. Prints ms/step for each.
"""

import jax
import jax.numpy as jnp

import common

D, QKV, F, L = 576, 960, 1536, 30


def make(layout):
    k = iter(jax.random.split(jax.random.key(0), 8 * L))
    shapes = {"wqkv": (D, QKV), "wo": (D, D), "w_gate_up": (D, 2 * F), "w_down": (F, D)}
    return [{n: jax.random.normal(next(k), s if layout == "in_out" else s[::-1], jnp.bfloat16) * 0.02
             for n, s in shapes.items()} for _ in range(L)]


def mm(x, w, layout):
    return x @ w if layout == "in_out" else jnp.einsum("bd,fd->bf", x, w)


def step(params, x, layout):
    for lp in params:
        h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True) + 1e-5).astype(x.dtype)
        qkv = mm(h, lp["wqkv"], layout)
        x = x + mm(qkv[:, :D], lp["wo"], layout)
        gu = mm(x, lp["w_gate_up"], layout)
        g, u = jnp.split(gu, 2, -1)
        x = x + mm(jax.nn.silu(g) * u, lp["w_down"], layout)
    return x


def main():
    res, rows = common.header(), []
    for batch in (1, 8):
        for layout in ("in_out", "out_in"):
            params = make(layout)
            run = jax.jit(lambda p, x, n: jax.lax.fori_loop(0, n, lambda i, x: step(p, x, layout), x))
            x = jax.random.normal(jax.random.key(1), (batch, D), jnp.bfloat16)
            lo = common.median_seconds(lambda: run(params, x, 64))
            hi = common.median_seconds(lambda: run(params, x, 320))
            rows.append({"B": batch, "layout": layout, "ms_per_step": 1000 * (hi - lo) / 256})
            print(f"B={batch} {layout}: {rows[-1]['ms_per_step']:.3f} ms/step (matmul part only)", flush=True)
    res["rows"] = rows
    md = (f"# Weight layout probe, {res['device_kind']}, jax {res['jax']}, {res['date']}\n\n"
          "30 SmolLM2-shaped layers, matmul part of a decode step only\n\n"
          + common.md_table(rows, ["B", "layout", "ms_per_step"]))
    common.write_results(f"layout_probe_{res['device']}_{res['date']}", res, md)


if __name__ == "__main__":
    main()
