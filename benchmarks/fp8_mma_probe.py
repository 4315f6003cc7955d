"""How Hopper's 8-bit wgmma accumulates: the rounding the FP8 attention's numpy model must include.

The float8 forward's GPU tests (session 36) matched the float32 reference (2 % off: P's e4m3 rounding)
but missed the P-rounded float64 model by 0.5 % at hd 128 / 256, where the interpreter (float32 dots)
had matched it to 1.6e-3. SageAttention2 reports that mma(f32.f8.f8.f32) on Hopper accumulates in
"FP22" (13 mantissa bits). This probe measures that rule directly with one warpgroup's wgmma chain
(C calls of [64, 128] x [128, N], one accumulator):

  row r of A holds 1.0 at key 0 and a small value t at key ``k_r`` (1: the same 32-key wgmma
  instruction, 32: the next instruction, 128: the next wgmma call), B's column n scales key k_r by
  2^-(n % 10) (e4m3 subnormals reach 2^-9); so out[r, n] - 1 = t * 2^-(n % 10), exact in float32,
  if the hardware kept every bit.

It prints, for each placement and sign, which rounding of the exact sum (toward zero or to nearest, to
b mantissa bits of the running sum) explains every entry. Run on a Hopper GPU:
  python3 benchmarks/fp8_mma_probe.py
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

F8 = jnp.float8_e4m3fn
N = 128                      # output columns: 2^-(n % 10) scales of the small term
PLACES = {"same instruction": 1, "next instruction": 32, "next wgmma call": 128}


def _smem(shape):
    tiling = plgpu.TilingTransform((8, 128))   # 8-bit, 128-byte swizzle: 128 elements a row
    return plgpu.SMEM(shape, F8, transforms=(tiling, plgpu.SwizzleTransform(128)))


@jax.jit
def mma_chain(a_CMK, b_CNK):
    """sum_c A_c B_c^T in one wgmma accumulator (zero-initialised), as float32 [64, N]."""
    C, M, K = a_CMK.shape

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, bar):
        for c in range(C):
            plgpu.copy_gmem_to_smem(a_gmem.at[c], a_smem.at[c], bar.at[0])
            plgpu.copy_gmem_to_smem(b_gmem.at[c], b_smem.at[c], bar.at[0])
        plgpu.barrier_wait(bar.at[0])

        def chain(acc_ref):
            for c in range(C):
                plgpu.wgmma(acc_ref, a_smem.at[c], b_smem.at[c].T)
            plgpu.wgmma_wait(0)
            return acc_ref[...]

        o_smem[...] = pl.run_scoped(chain, plgpu.ACC((M, N), jnp.float32))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    def entry(a_gmem, b_gmem, o_gmem):
        pl.run_scoped(lambda a, b, o, bar: body(a_gmem, b_gmem, o_gmem, a, b, o, bar),
                      _smem((C, M, K)), _smem((C, N, K)), plgpu.SMEM((M, N), jnp.float32),
                      plgpu.Barrier(num_arrivals=2 * C, num_barriers=1))

    return plgpu.kernel(entry, out_type=jax.ShapeDtypeStruct((M, N), jnp.float32))(a_CMK, b_CNK)


def _small_terms():
    """64 rows: t = +-(1 + m / 8) 2^-e, e in 3..6 (e4m3's normals end at 2^-6), m in 0..7."""
    t = [s * (1 + m / 8) * 2.0 ** -e for s in (1, -1) for e in (3, 4, 5, 6) for m in range(8)]
    return np.asarray(t, np.float64)


def _round(x, ref, bits, mode):
    """x rounded to the grid of ``bits`` mantissa bits at |ref|'s binade (ref = the exact sum)."""
    ulp = 2.0 ** (np.floor(np.log2(np.abs(ref))) - bits)
    q = x / ulp
    return (np.trunc(q) if mode == "toward zero" else np.round(q)) * ulp


def main():
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}")
    t = _small_terms()
    assert np.all(np.asarray(jnp.asarray(t, jnp.float32).astype(F8).astype(jnp.float32)) == t.astype(np.float32))
    scale_N = 2.0 ** -(np.arange(N) % 10)
    for name, k in PLACES.items():
        C = 1 + k // 128
        a = np.zeros((C, 64, 128))
        b = np.zeros((C, N, 128))
        a[0, :, 0], b[0, :, 0] = 1.0, 1.0
        a[k // 128, :, k % 128] = t
        b[k // 128, :, k % 128] = scale_N
        out = np.asarray(mma_chain(jnp.asarray(a, F8), jnp.asarray(b, F8)), np.float64)
        exact = 1.0 + t[:, None] * scale_N[None]
        for sign, rows in (("+", t > 0), ("-", t < 0)):
            o, e = out[rows], exact[rows]
            fits = []
            for ref_name, ref in (("the sum's", e), ("the accumulator's (1.0)", np.ones_like(e))):
                for mode in ("toward zero", "to nearest"):
                    bits = [b for b in range(8, 24) if np.array_equal(o, _round(e, ref, b, mode))]
                    if bits:
                        fits.append(f"{mode}, {bits[0]}..{bits[-1]} bits at {ref_name} binade")
            print(f"{name:17s} t {sign}: exact in float32: {np.array_equal(o, e.astype(np.float32))}; "
                  f"max |out - exact| {np.abs(o - e).max():.3g}; explained by: {fits or 'none of the roundings tried'}")
    # A random chain at the attention's shapes, against float64: the relative error of a K = d QK^T.
    rng = np.random.default_rng(0)
    for d in (64, 128, 256):
        C = d // 128 or 1
        kk = min(d, 128)
        a = np.zeros((C, 64, 128)); b = np.zeros((C, N, 128))
        a[:, :, :kk] = rng.standard_normal((C, 64, kk)); b[:, :, :kk] = rng.standard_normal((C, N, kk))
        a8, b8 = jnp.asarray(a, F8), jnp.asarray(b, F8)
        af, bf = np.asarray(a8.astype(jnp.float32), np.float64), np.asarray(b8.astype(jnp.float32), np.float64)
        exact = np.einsum("cmk,cnk->mn", af, bf)
        got = np.asarray(mma_chain(a8, b8), np.float64)
        rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
        print(f"random K={C * kk}: |out - exact| / |exact| = {rel:.3g} (float32 rounding alone: ~6e-8)")
    # Entries from {+-0.5, +-1, +-1.5} (the FP8 GPU test's exact-score inputs): every partial sum a
    # multiple of 0.25 below 2^11, which 13 bits hold; the result should be exact.
    grid = np.asarray([-1.5, -1, -0.5, 0.5, 1, 1.5])
    a, b = rng.choice(grid, (2, 64, 128)), rng.choice(grid, (2, N, 128))
    got = np.asarray(mma_chain(jnp.asarray(a, F8), jnp.asarray(b, F8)), np.float64)
    exact = np.einsum("cmk,cnk->mn", a, b)
    print(f"grid-valued K=256: max |out - exact| = {np.abs(got - exact).max():.3g}")


if __name__ == "__main__":
    main()
