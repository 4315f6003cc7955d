"""Which kernels one FA3 call launches and how long each runs (CUPTI, median over iterations), for
short rows of the FA3 table: the Pallas kernel and the XLA ops around it (k_end clip / pad, per-tile
min / max), with k_end a jit constant (as bench_fa3.py passes it) and as an argument (as the model).

    PYTHONPATH=. python3 benchmarks/fa3_kernels_probe.py
"""
import statistics

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

from pallas_kernels.flash_attention import default_config, flash_attention_fwd, key_end


def main():
    print(jax.devices()[0].device_kind, jax.__version__)
    for hd, S, causal in ((128, 512, False), (256, 512, False), (64, 512, True), (128, 4096, True), (128, 16384, True)):
        B, H = 16384 // S, 2048 // hd
        cfg = default_config(hd, S, causal)
        kend = key_end(B, S, S, causal="top_left" if causal else "none")
        q, k, v = (jax.random.normal(kk, (B, S, H, hd), jnp.bfloat16) for kk in jax.random.split(jax.random.key(0), 3))
        const = jax.jit(lambda q, k, v: flash_attention_fwd(q, k, v, kend, config=cfg)[0])
        arg = jax.jit(lambda q, k, v, e: flash_attention_fwd(q, k, v, e, config=cfg)[0])
        for name, fn, args in (("kend constant", const, (q, k, v)), ("kend argument", arg, (q, k, v, kend))):
            _, t = profiler.measure(fn, aggregate=False, iterations=10)(*args)
            per = {}
            for it in t:
                for kname, ms in it:
                    per.setdefault(kname, []).append(ms)
            total = sum(statistics.median(v) for v in per.values())
            print(f"hd{hd} S={S} causal={causal} {cfg.block_kv}/{'B' if cfg.balanced else 'P' if cfg.persistent else 'G'} "
                  f"{name}: total {total * 1e3:.1f} us; " + "; ".join(
                      f"{kn[:40]} {statistics.median(v) * 1e3:.1f} us" for kn, v in per.items()), flush=True)


if __name__ == "__main__":
    main()
