"""Move a few KV-cache rows within every layer's cache in ONE launch (Pallas on the Triton backend).

After a draft tree is verified, the accepted path's K/V rows sit at the slots of their tree nodes
(``start + nodes[r]``) and must move to position order (``start + r``) in every layer's K and V cache.
As XLA ops that is one gather and one dynamic-update-slice per array: 120 small kernels per cycle for
SmolLM2's 30 layers, ~165 us of a ~1.45 ms tree cycle on an H200 (benchmarks/NOTES.md item 33). Here one
program per (sequence, array) loads the R rows and stores them at their new slots; all arrays are
aliased to the outputs, so nothing else is copied.

Semantics (``move_rows_reference``): for each array ``c [B, S, G, d]`` and sequence b,
``c[b, start[b] + r] <- c[b, start[b] + rows[b, r]]`` for r < R, all reads before any write (a program
loads its rows before it stores). Rows must lie inside the cache (``start + max(rows, R - 1) < S``, as the
speculative loop's capacity guard ensures); a write past the end is dropped and a read past it clipped.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning)


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _kernel(rows_ref, start_ref, *refs, n: int, R: int, G: int, M: int):
    """One program = (sequence b, array i): rows ``start + rows[r]`` -> ``start + r`` of array i.

    rows_ref [R_pad] int32, start_ref [1]; refs: n arrays [S * G, d] (slot s, kv head g at row s * G + g),
    then the same n arrays as outputs (aliased)."""
    ins, outs = refs[:n], refs[n:]
    SG, d = ins[0].shape
    m = lax.broadcasted_iota(jnp.int32, (M,), 0)
    r, g = m // G, m % G
    valid = r < R
    src_slot = start_ref[0] + plgpu.load(rows_ref.at[jnp.where(valid, r, 0)])
    src = jnp.minimum(src_slot * G + g, SG - G + g)
    dst = (start_ref[0] + r) * G + g
    valid = valid & (dst < SG)
    dst = jnp.where(valid, dst, SG)  # masked rows also get an out-of-range index (the interpreter's scatter drops it)
    col = lax.broadcasted_iota(jnp.int32, (d,), 0)
    mask = jnp.broadcast_to(valid[:, None], (M, d))
    pid = pl.program_id(1)
    for i in range(n):
        @pl.when(pid == i)
        def _(i=i):
            x = plgpu.load(ins[i].at[src[:, None], col[None, :]], mask=mask, other=0)
            plgpu.store(outs[i].at[dst[:, None], col[None, :]], x, mask=mask)


def _build(B: int, n: int, R: int, SG: int, G: int, d: int, shapes, interpret: bool):
    """Builder (not a kernel): ``fn(rows [B, R_pad], start [B, 1], *arrays [B, S*G, d]) -> arrays``."""
    R_pad, M = _pow2_at_least(R), _pow2_at_least(R * G)
    array_spec = pl.BlockSpec((None, SG, d), lambda b, i: (b, 0, 0))
    return pl.pallas_call(
        functools.partial(_kernel, n=n, R=R, G=G, M=M), grid=(B, n),
        in_specs=[pl.BlockSpec((None, R_pad), lambda b, i: (b, 0)), pl.BlockSpec((None, 1), lambda b, i: (b, 0))]
        + [array_spec] * n,
        out_specs=[array_spec] * n, out_shape=shapes, input_output_aliases={2 + i: i for i in range(n)},
        compiler_params=plgpu.CompilerParams(num_warps=1, num_stages=1), interpret=interpret, name="move_rows")


@functools.partial(jax.jit, static_argnames=("interpret",))
def move_rows(arrays: tuple[jax.Array, ...], start_B: jax.Array, rows_BR: jax.Array, *, interpret: bool = False):
    """Jitted entry: every array ``[B, S, G, d]``'s slots ``start_B[b] + rows_BR[b, r]`` moved to
    ``start_B[b] + r`` (module doc), in place where XLA can donate the arrays. Returns the arrays (a tuple)."""
    arrays = tuple(arrays)
    if not arrays or any(a.shape != arrays[0].shape or a.dtype != arrays[0].dtype for a in arrays):
        raise ValueError(f"move_rows needs one or more arrays of one shape and dtype, got "
                         f"{[(a.shape, str(a.dtype)) for a in arrays]}")
    B, S, G, d = arrays[0].shape
    if rows_BR.ndim != 2 or rows_BR.shape[0] != B or start_B.shape != (B,):
        raise ValueError(f"expected rows [B, R] and start [B] with B = {B}, got rows {rows_BR.shape}, "
                         f"start {start_B.shape}")
    R = rows_BR.shape[1]
    rows = jnp.pad(rows_BR.astype(jnp.int32), ((0, 0), (0, _pow2_at_least(R) - R)))
    flat = tuple(a.reshape(B, S * G, d) for a in arrays)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in flat]
    out = _build(B, len(arrays), R, S * G, G, d, shapes, interpret)(
        rows, start_B.astype(jnp.int32)[:, None], *flat)
    return tuple(o.reshape(B, S, G, d) for o in out)


def move_rows_reference(arrays, start_B, rows_BR):
    """Pure jnp (not a kernel): a gather and a dynamic-update-slice per array and sequence."""
    def one(c_SGd, r_R, s):
        return lax.dynamic_update_slice(c_SGd, jnp.take(c_SGd, s + r_R, axis=0, mode="clip"), (s, 0, 0))
    return tuple(jax.vmap(one)(a, rows_BR.astype(jnp.int32), start_B) for a in arrays)


def main(argv=None) -> None:
    """GPU benchmark (not a kernel): median CUPTI time of moving a depth-7 path (8 rows) in SmolLM2's 60 cache
    arrays (B=1, 1024 slots, 3 kv heads, d=64, bf16): the XLA gathers + updates vs this kernel."""
    import argparse
    import numpy as np
    from jax.experimental.mosaic.gpu import profiler
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=20)
    a = ap.parse_args(argv)
    arrays = tuple(jax.random.normal(jax.random.key(i), (1, 1024, 3, 64), jnp.bfloat16) for i in range(60))
    start, rows = jnp.array([500], jnp.int32), jnp.array([[0, 1, 3, 6, 10, 13, 14, 15]], jnp.int32)
    want = move_rows_reference(arrays, start, rows)
    got = move_rows(arrays, start, rows)
    ok = all(bool(jnp.array_equal(x, y)) for x, y in zip(got, want))
    times = {}
    for name, f in (("xla", jax.jit(move_rows_reference)), ("kernel", move_rows)):
        _, ms = profiler.measure(f, iterations=a.iterations)(arrays, start, rows)
        times[name] = 1000 * float(np.median(ms))
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}: 60 arrays [1, 1024, 3, 64] bf16, 8 rows: "
          f"XLA {times['xla']:.1f} us, kernel {times['kernel']:.1f} us, equal: {ok}")


if __name__ == "__main__":
    main()
