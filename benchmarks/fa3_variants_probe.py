"""Probe (GPU): forward TFLOPS of this tree's FA3 kernel against another revision of it, default and
overlap configs, on a few FA3-table shapes, in one process, with max |o - the other's default|.
Run with MOSAIC_GPU_DUMP_PTXAS=1 to see ptxas' serialisation warnings (C7513 ...) per kernel. The
other revision is read from ``benchmarks/_fa_head.py`` (gitignored; carry it to the device):

    git show HEAD:pallas_kernels/flash_attention.py > benchmarks/_fa_head.py
    PYTHONPATH=. MOSAIC_GPU_DUMP_PTXAS=1 python3 benchmarks/fa3_variants_probe.py [HEAD_DIMS, e.g. 128]
"""
import statistics, sys, jax, jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler
from pallas_kernels import flash_attention as new
from benchmarks import _fa_head as head

SHAPES = [(128, 16384, False), (128, 4096, False), (64, 4096, False), (64, 16384, False),
          (256, 4096, False), (256, 16384, False), (128, 16384, True), (256, 2048, False)]
if len(sys.argv) > 1:  # head dims, e.g. "128": every S of the FA3 table, both masks
    SHAPES = [(int(hd), S, c) for hd in sys.argv[1].split(",") for c in (False, True)
              for S in (512, 1024, 2048, 4096, 8192, 16384)]
print(jax.devices()[0].device_kind, jax.__version__, flush=True)
for hd, S, causal in SHAPES:
    B, H = 16384 // S, 2048 // hd
    ks = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(x, (B, S, H, hd), jnp.bfloat16) for x in ks)
    kend = new.key_end(B, S, S, causal="top_left" if causal else "none")
    flops = 4 * B * S * S * H * hd / (2 if causal else 1)
    runs = {}
    for mname, m in (("head", head), ("new", new)):
        for cname, make in (("default", m.default_config), ("overlap", m.overlap_config)):
            c = make(hd, S, causal)
            runs[f"{mname}-{cname}"] = jax.jit(
                lambda q, k, v, c=c, m=m: m.flash_attention_fwd(q, k, v, kend, config=c)[0])
    ref = None
    for name, f in runs.items():
        try:
            o = f(q, k, v).block_until_ready()
            ref = o if ref is None else ref
            err = float(jnp.max(jnp.abs(o.astype(jnp.float32) - ref.astype(jnp.float32))))
            _, t = profiler.measure(f, iterations=20)(q, k, v)
            print(f"hd{hd} S{S} causal={causal} {name}: {flops / statistics.median(t) / 1e9:.0f} TFLOPS,"
                  f" max|o - head-default| {err:.3g}", flush=True)
        except Exception as e:
            print(f"hd{hd} S{S} causal={causal} {name}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
