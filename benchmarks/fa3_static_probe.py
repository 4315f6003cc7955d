"""Probe (GPU): the FA3 forward's static masks against the k_end array, and "none"'s rows' k_end and step
counts as constants against S + a zero read from memory (``flash_attention.OPAQUE_ROW`` / ``OPAQUE_BOUNDS``), on
the bf16 non-causal rows, where the first table of the static masks moved (fa3_h200_2026-12-01_static.*). One process, the forms in turn, 3 rounds, order reversed.

    PYTHONPATH=.:benchmarks python3 benchmarks/fa3_static_probe.py
"""
import statistics

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

import pallas_kernels.flash_attention as fa
from bench_fa3 import measure_row
from common import device_name

ROWS = [(S, hd, False) for hd in (64, 128, 256) for S in (512, 1024, 2048, 4096, 8192, 16384)]


def label(cfg):
    flags = [n for n in ("persistent", "balanced", "overlap", "spare_q", "prefetch", "alternate_gemms") if getattr(cfg, n)]
    return f"{cfg.block_kv}/{cfg.num_stages}/c{cfg.consumers}" + "".join(f"+{n}" for n in flags)


def forms(S, hd, causal, qkv):
    B, H = 16384 // S, 2048 // hd
    mask = "top_left" if causal else "none"
    cfg = fa.default_config(hd, S, causal)
    kend = fa.key_end(B, S, S, causal=mask)
    raw = fa.flash_attention_fwd.__wrapped__   # traced anew per form: OPAQUE_BOUNDS is read at trace time

    def static(steps, row):  # traced (by this first call) with the switches set; later calls reuse that trace
        fa.OPAQUE_BOUNDS, fa.OPAQUE_ROW = steps, row
        f = jax.jit(lambda q, k, v: raw(q, k, v, causal=mask, config=cfg)[0])
        f(*qkv).block_until_ready()
        fa.OPAQUE_BOUNDS = fa.OPAQUE_ROW = False
        return f
    return {"kend": jax.jit(lambda q, k, v: raw(q, k, v, kend, config=cfg)[0]),
            "static_const": static(False, False), "static_row": static(False, True),
            "static_both": static(True, True),
            "cudnn": jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=causal, implementation="cudnn"))}


def measure(fn, args, iters):
    fn(*args).block_until_ready()
    _, t = profiler.measure(fn, iterations=iters)(*args)
    return statistics.median(t)


def main():
    print(f"{device_name()}, jax {jax.__version__}: TFLOPS, median of 3 rounds (order reversed each round)")
    print("| S | hd | causal | config | k_end array | static | static, opaque row | static, opaque row + steps | cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|")
    for S, hd, causal in ROWS:
        B, H = 16384 // S, 2048 // hd
        qkv = [jax.random.normal(k, (B, S, H, hd), jnp.bfloat16) for k in jax.random.split(jax.random.key(S + hd), 3)]
        impls = forms(S, hd, causal, qkv)
        t = measure_row(impls, qkv, 20, 3, measure)
        flops = 4 * B * S * S * H * hd / (2 if causal else 1)
        tf = {n: flops / statistics.median(v) / 1e9 for n, v in t.items()}
        print(f"| {S} | {hd} | {causal} | {label(fa.default_config(hd, S, causal))} | {tf['kend']:.0f} | "
              f"{tf['static_const']:.0f} | {tf['static_row']:.0f} | {tf['static_both']:.0f} | {tf['cudnn']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
