"""Probe (GPU): the verify forward's skinny GEMMs (T = K+1 rows of the SmolLM2 shape) against a Mosaic GPU
kernel that issues all of its weight loads at once.

    PYTHONPATH=.:benchmarks python3 benchmarks/skinny_gemm_probe.py [--ts 1,8] [--bns 8,16,32] [--configs]

Why (benchmarks/NOTES.md item 46): item 41 put 448 us of a T=5 verify forward (844 us) in XLA's Triton GEMMs,
121 of them at ~3.7 us, where a one-row step's reductions take ~2.8 us; the GEMMs run 6.5x their weights' read
time. A GEMM of <= 16 rows reads ~0.7-3.5 MB of weights and little else, so it is bound by how many bytes it has
in flight. The kernel here (``skinny_matmul``): one warpgroup per CTA, a grid over N blocks of ``bn`` weight
rows; the CTA issues TMA copies of its whole weight slab [bn, K] in 64-column chunks (one barrier each) and of
x's T rows at once, then one wgmma per chunk as each lands, and stores the T rows through SMEM.

What it times (``timer``): a ``fori_loop`` whose every iteration runs 30 matmuls over 30 distinct weights of one
layer shape (as the 30 layers: ~105 MB for gate|up, past the 50 MB L2), each output fed into the next input,
(t(r2) - t(r1)) / (30 (r2 - r1)) per matmul. XLA's form at T=1 (its reduction) and T>1 (its Triton GEMM), the
kernel at T>1. ``--configs`` looks for the Triton GEMM configs in the compiled HLO (on jax 0.11.2 it found none and
prints the fusion kinds; ``xla_tiling_gpu.sh`` dumps the autotuner's choices instead). XLA's exhaustive tiling search:
``xla_tiling_gpu.sh`` (item 47: other configs, the same time).

Outcome (one H100, 2026-12-06, ``results/skinny_gemm_H100_2026-12-06_run2_log.txt``; NOTES item 46): correct, but
slower than XLA's GEMMs (level at gate|up, ~1.8x at down), and the verify forward with every matmul routed through
it 15-30 % slower. Kept as a probe; ``layers.linear`` does not use it.
"""
from __future__ import annotations

import argparse
import functools
import re

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import common
from pallas_kernels.flash_attention import _smem_tiled
from specjax.layers import linear as _linear

# SmolLM2-135M: D = 576, q|k|v 576 -> 960, o 576 -> 576, gate|up 576 -> 3072, down 1536 -> 576
SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
KC = 64  # K columns per chunk: the 128-byte swizzle of bf16; one TMA load and one barrier each


def skinny_matmul(x_TK, w_NK, *, bn: int = 16, out_dtype=None, interpret: bool = False):
    """``x_TK @ w_NK.T`` for a weight stored ``[out, in]`` (``layers.linear``'s layout), bf16 in and out, float32
    accumulation, for T a multiple of 8 up to 64; ``out_dtype`` (default x's) float32 keeps the accumulator.

    wgmma's A operand has 64 rows, x has T. So x's K chunks (64 columns, the 128-byte swizzle) lie T rows apart
    in one SMEM buffer and chunk j's A is the 64-row window from row j * T: its first T rows are chunk j, the
    rest other chunks' rows (or never written), whose output rows are never stored. The buffer takes
    (nk - 1) * T + 64 rows instead of 64 * nk. B is the weight's [bn, 64] tile, transposed (K-major)."""
    T, K = x_TK.shape
    N = w_NK.shape[0]
    if T % 8 or T > 64 or K % KC or N % bn or bn % 8 or bn > 256:
        raise ValueError(f"skinny_matmul needs T % 8 == 0 and T <= 64, K % {KC} == 0, N % bn == 0 and bn a "
                         f"multiple of 8 up to 256; got T={T}, K={K}, N={N}, bn={bn}")
    nk = K // KC
    out_dtype = jnp.dtype(out_dtype or x_TK.dtype)

    def body(x_ref, w_ref, o_ref, x_smem, w_smem, o_smem, x_bar, w_bar):
        n0 = lax.axis_index("n") * bn
        for j in range(nk):  # every load in flight at once
            plgpu.copy_gmem_to_smem(w_ref.at[pl.ds(n0, bn), pl.ds(j * KC, KC)], w_smem.at[j], w_bar.at[j])
            plgpu.copy_gmem_to_smem(x_ref.at[:, pl.ds(j * KC, KC)], x_smem.at[pl.ds(j * T, T)], x_bar.at[0])

        def mma(acc_ref):
            plgpu.barrier_wait(x_bar.at[0])
            for j in range(nk):
                plgpu.barrier_wait(w_bar.at[j])
                plgpu.wgmma(acc_ref, x_smem.at[pl.ds(j * T, 64)], w_smem.at[j].T)
            return acc_ref[...]
        acc = pl.run_scoped(mma, plgpu.ACC((64, bn), jnp.float32))
        o_smem[...] = acc.astype(o_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem.at[pl.ds(0, T)], o_ref.at[:, pl.ds(n0, bn)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    scratch = (_smem_tiled(((nk - 1) * T + 64, KC), x_TK.dtype), _smem_tiled((nk, bn, KC), w_NK.dtype),
               plgpu.SMEM((64, bn), out_dtype),
               plgpu.Barrier(num_arrivals=nk, num_barriers=1), plgpu.Barrier(num_barriers=nk))
    kw = dict(interpret=plgpu.InterpretGPUParams()) if interpret else {}
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((T, N), out_dtype), scratch_types=scratch,
                        grid=(N // bn,), grid_names=("n",), num_threads=1, thread_name="wg",
                        compiler_params=plgpu.CompilerParams(reduction_scratch_bytes=0), **kw)(x_TK, w_NK)


@functools.lru_cache(maxsize=None)
def jitted(bn: int, out_dtype=None):
    """``skinny_matmul`` at one block and output dtype, jitted once: a program's call sites then share one
    lowered function (one Mosaic GPU lowering instead of one per call site: 0.2 s against 5 s for 30 calls when
    lowering for CUDA on this repo's CPU host)."""
    return jax.jit(functools.partial(skinny_matmul, bn=bn, out_dtype=out_dtype))


def pick_bn(N: int) -> int:
    """The widest column block that still gives >= 72 CTAs (SmolLM2: q|k|v, o and down 8, gate|up 32)."""
    return next((bn for bn in (64, 32, 16, 8) if N % bn == 0 and N // bn >= 72), 8)


def routed_linear(original):
    """``layers.linear`` with the kernel for bf16 products of 2-64 rows, padded to a multiple of 8
    (the ``mgpu_linear`` variant of ``verify_cost_probe`` and ``verify_forward_probe``, through
    ``verify_cost_probe.LINEARS``), float32 out as ``linear`` gives; everything else goes to ``original``."""
    def linear(x_BTI, w_OI, compute_dtype="param"):
        K, N = x_BTI.shape[-1], w_OI.shape[0]
        rows = x_BTI.size // K
        if compute_dtype != "param" or w_OI.dtype != jnp.bfloat16 or rows < 2 or rows > 64 or K % KC or N % 8:
            return original(x_BTI, w_OI, compute_dtype)
        pad = -rows % 8  # rows to a multiple of 8 (meant to fuse into x's producer; on the H100 it ran as a kernel
        # of its own, ~1.2 us per call, NOTES item 46)
        x_TK = jnp.pad(x_BTI.reshape(rows, K).astype(w_OI.dtype), ((0, pad), (0, 0)))
        out = jitted(pick_bn(N), jnp.float32)(x_TK, w_OI)[:rows]
        return out.reshape(*x_BTI.shape[:-1], N)
    return linear


def _xla(x_TK, w_NK):
    """``layers.linear``'s product (bf16 operands, float32 accumulation), rounded to bf16. The function bound at
    import: ``verify_cost_probe.patched_linear`` swaps ``layers.linear`` while tracing."""
    return _linear(x_TK, w_NK).astype(x_TK.dtype)


def _next_input(y_TN, K: int, dtype):
    """A matmul's output as the next one's input (its first K columns, tiled where N < K): a data dependence."""
    return (jnp.tile(y_TN, (1, pl.cdiv(K, y_TN.shape[1])))[:, :K] * 0.5).astype(dtype)


def _chain(matmul):
    """``rounds`` (traced: one compilation for every count) loop iterations of 30 matmuls each, one per weight
    (30 arrays, as the 30 layers' are), each output feeding the next input. A ``while_loop`` iteration has a fixed
    cost of its own, here spread over 30 matmuls (session 54's first run had one matmul per iteration and read
    10-25 us per matmul, ~5x what a GEMM takes in the forward: most of it, by that reading, the iteration's cost)."""
    def run(x_TK, ws, rounds):
        def body(i, x):
            for w in ws:
                x = _next_input(matmul(x, w), x.shape[1], x.dtype)
            return x
        return lax.fori_loop(0, rounds, body, x_TK)
    return jax.jit(run)


def timer(matmul, x, ws, r1: int = 2, r2: int = 8, repeats: int = 3):
    """Compiles the chain once; each call of the returned function times it at ``r1`` and ``r2`` rounds
    (``common.median_seconds``, as ``verify_cost_probe.forward_ms``): us per matmul (with its ``_next_input``
    fusion, the same for every form)."""
    chain = _chain(matmul)

    def us() -> float:
        t1, t2 = (common.median_seconds(lambda r=r: chain(x, ws, jnp.int32(r)), repeats) for r in (r1, r2))
        return (t2 - t1) / ((r2 - r1) * len(ws)) * 1e6
    return us


def xla_configs(x, w) -> list[str]:
    hlo = jax.jit(_xla).lower(x, w).compile().as_text()
    found = sorted(set(re.findall(r'"(?:triton_gemm_config|tritonGemmConfig)":\{[^}]*\}', hlo)))
    kinds = sorted(set(re.findall(r"kind=k(\w+)", hlo)))
    return found or [f"no Triton GEMM; fusion kinds {kinds}"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ts", default="1,8")
    ap.add_argument("--bns", default="8,16,32", help="kernel column blocks ('' = XLA only)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--configs", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    h = common.header()
    print(f"{h['device_kind']}, jax {h['jax']}, {h['date']}: {h['command']}", flush=True)
    key = jax.random.PRNGKey(0)
    print("| shape | T | form | round | us per matmul |\n|---|---|---|---|---|", flush=True)
    for name in a.shapes.split(","):
        K, N = SHAPES[name]
        ws = tuple((jax.random.normal(k, (N, K), jnp.float32) * K ** -0.5).astype(jnp.bfloat16)
                   for k in jax.random.split(key, 30))
        for T in map(int, a.ts.split(",")):
            x = jax.random.normal(key, (T, K), jnp.float32).astype(jnp.bfloat16)
            if a.configs:
                print(f"{name} T={T} XLA:", *xla_configs(x, ws[0]), flush=True)
            forms = {"xla": timer(_xla, x, ws)}
            if T % 8 == 0:
                want = _xla(x, ws[0]).astype(jnp.float32)
                for bn in [int(b) for b in a.bns.split(",") if b]:
                    if N % bn == 0:
                        f = jitted(bn)
                        err = float(jnp.max(jnp.abs(f(x, ws[0]).astype(jnp.float32) - want)))
                        print(f"{name} T={T} bn={bn}: max |kernel - XLA| {err:.3g} (max |XLA| "
                              f"{float(jnp.max(jnp.abs(want))):.3g})", flush=True)
                        forms[f"mgpu{bn}"] = timer(f, x, ws)
            for r in range(a.rounds):
                for label, us in forms.items():
                    print(f"| {name} | {T} | {label} | r{r} | {us():.2f} |", flush=True)


if __name__ == "__main__":
    main()
