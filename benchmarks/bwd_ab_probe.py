"""A/B of the FA3 backward kernels: this tree's ``flash_attention_bwd`` against an earlier version of the file,
same inputs, outputs compared bit for bit, timed alternately (CUPTI median per call: the kernels plus XLA's small ops).
The earlier version is ``benchmarks/_bwd_prev.py``, written before the device call and not committed (the device
machine gets the working tree, not git's history), e.g. the previous commit's:

    git show HEAD~1:pallas_kernels/flash_attention_bwd.py > benchmarks/_bwd_prev.py
    PYTHONPATH=.:benchmarks python3 benchmarks/bwd_ab_probe.py [--rounds 2] [--head-dims 64,128] [--seq 4096] [--causal]
        [--fused]

``--fused``: both versions with ``fused_dq=True`` on the head dim's ``default_bwd_config``, and this tree's default
(the two kernels) timed in the same rounds as ``split``. The one kernel adds dQ into float32 by TMA in no fixed
order, so its outputs are compared by their largest difference, not bit for bit.
"""

import argparse
import dataclasses
import statistics

import jax
import jax.numpy as jnp

import _bwd_prev
from bench_fa3 import measure_row
from common import backward_inputs, relative_differences
from pallas_kernels import flash_attention_bwd as cur


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--fused", action="store_true", help="both versions with fused_dq=True, and this tree's split")
    a = ap.parse_args(argv)
    S = a.seq
    for d in (int(x) for x in a.head_dims.split(",")):
        args, kend = backward_inputs(S, d, a.causal)
        B, H = args[0].shape[0], args[0].shape[2]
        config = lambda m: dataclasses.replace(m.default_bwd_config(d), fused_dq=a.fused)   # m's own class
        fns = {name: jax.jit(lambda *x, m=m: m.flash_attention_bwd(*x, kend, config=config(m)))
               for name, m in (("prev", _bwd_prev), ("this", cur))}
        if a.fused:
            fns["split"] = jax.jit(lambda *x: cur.flash_attention_bwd(*x, kend, config=cur.default_bwd_config(d)))
        outs = {n: jax.block_until_ready(f(*args)) for n, f in fns.items()}
        same = all(bool(jnp.array_equal(x, y)) for x, y in zip(outs["prev"], outs["this"]))
        if a.fused:
            diff = {n: relative_differences(outs[n], outs["split"]) for n in ("prev", "this")}
            print(f"hd {d}: against the split, dq / dk / dv: prev {diff['prev']}, this {diff['this']}")
        times = measure_row(fns, args, 20, a.rounds)   # alternated, as the tables
        flops = 10 * B * S * S * H * d / (2 if a.causal else 1)
        print(f"hd {d} S {S} causal={a.causal}: bitwise equal outputs {same}; " + "; ".join(
            f"{n} {' / '.join(f'{t:.3f}' for t in ts)} ms ({flops / statistics.median(ts) / 1e9:.0f} TFLOPS)"
            for n, ts in times.items()))


if __name__ == "__main__":
    main()
