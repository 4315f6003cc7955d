"""Where the FA3 backward's one kernel (``BwdConfig.fused_dq``) spends its time: the kernel with one more of its
dQ pieces cut away at each step, and other ways to write its dQ part, timed in the same rounds as the whole one
kernel and the split (dK/dV + dQ kernels).

Each variant is this tree's ``pallas_kernels/flash_attention_bwd.py`` with source lines replaced (every replacement
must apply exactly once, so a changed kernel stops the probe instead of timing something else), written to a
temporary module. The cut variants compute wrong dQ by construction (timing only); each variant's largest
difference from the split is printed.

    full      the one kernel as it is
    noreduce  no TMA reduce-add of the dQ part into GMEM
    nostore   also no store of the dQ part to SMEM (its wgmmas still waited for)
    nodq      also no dQ wgmmas (each consumer still stores its dS^T and waits for the other's)
    nomeet    also no wait for the other consumer (dS^T still stored; dK's A operand from SMEM)
    atomic    (exact) the dQ part added into GMEM from registers by atomics (``plgpu.atomic_add``), no SMEM tile
    swz32 / swz64 / flat  (exact) the float32 SMEM tile of the dQ part swizzled by 32 / 64 bytes, or untiled
    splitdkv  the split without its dQ kernel: its dK/dV kernel alone (dQ is q), beside "nodq"

    PYTHONPATH=.:benchmarks python3 benchmarks/bwd_fused_ablation.py [--rounds 3] [--head-dims 128,64] [--seq 4096]
"""

import argparse
import dataclasses
import importlib.util
import pathlib
import sys
import tempfile

import jax

from bench_fa3 import measure_row
from common import backward_inputs, relative_differences
from pallas_kernels import flash_attention_bwd as cur

_REDUCE = 'plgpu.copy_smem_to_gmem(dq_smem.at[wg], dq_ref.at[target], reduction_op="add")'
_TILE = "_smem_tiled((2, *cfg.dq_part(d)), jnp.float32)"
_VARIANTS = {   # variant: (the variant it starts from, (old, new) replacements)
    "noreduce": ("full", [(_REDUCE, "pass")]),
    "nostore": ("noreduce", [("dq_smem.at[wg][...] = acc[...]", "plgpu.wgmma_wait(0)")]),
    "nodq": ("nostore", [("pl.run_scoped(dq_part, plgpu.ACC((rows, cols), jnp.float32))", "pass")]),
    "nomeet": ("nodq", [("plgpu.barrier_wait(meet.at[par])   # the other consumer's dS^T is in SMEM", "pass")]),
    "atomic": ("full", [(_REDUCE, "pass"), (
        "dq_smem.at[wg][...] = acc[...]",
        "plgpu.atomic_add(dq_ref.at[bi, pl.ds(head_block(ki)[1] * bq + r0, rows), head_block(ki)[0], "
        "pl.ds(c0, cols)], acc[...])")]),
    "swz32": ("full", [(_TILE, "_smem_tiled((2, *cfg.dq_part(d)), jnp.float32, 32)")]),
    "swz64": ("full", [(_TILE, "_smem_tiled((2, *cfg.dq_part(d)), jnp.float32, 64)")]),
    "flat": ("full", [(_TILE, "plgpu.SMEM((2, *cfg.dq_part(d)), jnp.float32)")]),
    "splitdkv": ("full", [(
        "dq = _build_dq(B, Tq, H, Sk, G, d, q.dtype, cfg, scale)(q, k, v, do, stats, kend, kmin, kmax)", "dq = q")]),
}
_SPLIT = {"splitdkv"}   # run with the split's config (two kernels), not fused_dq


def _variants(tmp: pathlib.Path, names=None) -> dict:
    """name -> module: the file as it is ("full"), and each variant (``names``: those; None: all)."""
    if unknown := set(names or ()) - set(_VARIANTS):
        raise SystemExit(f"unknown variants {sorted(unknown)}; the variants are {', '.join(_VARIANTS)}")
    srcs, mods = {"full": pathlib.Path(cur.__file__).read_text()}, {"full": cur}
    for name, (parent, cuts) in _VARIANTS.items():
        src = srcs[parent]
        for old, new in cuts:
            if src.count(old) != 1:
                raise SystemExit(f"{name}: {old!r} occurs {src.count(old)} times in flash_attention_bwd.py, not once")
            src = src.replace(old, new)
        srcs[name] = src
        if names is not None and name not in names:
            continue
        path = tmp / f"_bwd_{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"_bwd_{name}", path)
        mods[name] = sys.modules[spec.name] = importlib.util.module_from_spec(spec)   # dataclasses look it up
        spec.loader.exec_module(mods[name])
    return mods


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--head-dims", default="128,64")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--variants", default=None, help=f"comma-separated, of {', '.join(_VARIANTS)} (default: all)")
    a = ap.parse_args(argv)
    S = a.seq
    with tempfile.TemporaryDirectory() as tmp:
        mods = _variants(pathlib.Path(tmp), a.variants and a.variants.split(","))
        for d in (int(x) for x in a.head_dims.split(",")):
            args, kend = backward_inputs(S, d, causal=False)
            # each module's own BwdConfig class; the split's variants keep its two kernels
            config = lambda n, m: dataclasses.replace(m.default_bwd_config(d), fused_dq=n not in _SPLIT)
            fns = {n: jax.jit(lambda *x, n=n, m=m: m.flash_attention_bwd(*x, kend, config=config(n, m)))
                   for n, m in mods.items()}
            fns["split"] = jax.jit(lambda *x: cur.flash_attention_bwd(*x, kend, config=cur.default_bwd_config(d)))
            outs = {n: jax.block_until_ready(f(*args)) for n, f in fns.items()}
            diffs = "; ".join(f"{n} {relative_differences(outs[n], outs['split'])}" for n in mods)
            print(f"hd {d}: largest difference from the split, relative to its largest value, dq / dk / dv: {diffs}")
            times = measure_row(fns, args, 20, a.rounds)
            print(f"hd {d} S {S} non-causal, ms per backward (rounds): " + "; ".join(
                f"{n} {' / '.join(f'{t:.3f}' for t in ts)}" for n, ts in times.items()))


if __name__ == "__main__":
    main()
