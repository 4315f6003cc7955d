"""Probe (GPU): FA3 forward TFLOPS of the default config, the intra-warpgroup overlap, and both with P
through SMEM (the `interpretable` variant), on a few shapes, with max |o - default|. Run with
MOSAIC_GPU_DUMP_PTXAS=1 to see ptxas' register/serialisation report per kernel. Result of one H200
run: results/fa3_overlap_probe_H200_2026-11-26.txt.

    PYTHONPATH=. MOSAIC_GPU_DUMP_PTXAS=1 python3 benchmarks/fa3_overlap_probe.py
"""
import dataclasses, statistics, jax, jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler
from pallas_kernels.flash_attention import default_config, overlap_config, flash_attention_fwd, key_end
print(jax.devices()[0].device_kind)
for hd, S, causal in ((128, 4096, False), (128, 16384, False), (64, 4096, False), (256, 4096, False), (128, 4096, True)):
    B, H = 16384 // S, 2048 // hd
    ks = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(x, (B, S, H, hd), jnp.bfloat16) for x in ks)
    kend = key_end(B, S, S, causal="top_left" if causal else "none")
    flops = 4 * B * S * S * H * hd / (2 if causal else 1)
    base = default_config(hd, S)
    cfgs = {"default": base, "overlap": overlap_config(hd, S),
            "overlap+P_smem": dataclasses.replace(overlap_config(hd, S), interpretable=True),
            "P_smem": dataclasses.replace(base, interpretable=True)}
    ref = None
    for name, c in cfgs.items():
        try:
            f = jax.jit(lambda q, k, v, c=c: flash_attention_fwd(q, k, v, kend, config=c)[0])
            o = f(q, k, v).block_until_ready()
            if ref is None: ref = o
            err = float(jnp.max(jnp.abs(o.astype(jnp.float32) - ref.astype(jnp.float32))))
            _, t = profiler.measure(f, iterations=10)(q, k, v)
            print(f"hd{hd} S{S} causal={causal} {name}: {flops / statistics.median(t) / 1e9:.0f} TFLOPS, max|o-default| {err:.3g}", flush=True)
        except Exception as e:
            print(f"hd{hd} S{S} {name}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
