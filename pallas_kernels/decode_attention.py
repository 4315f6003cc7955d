"""Decode / verify attention: a few queries (T = 1..16) against a KV cache, in Pallas on the Triton
backend, flash-decoding style.

Layout. The R = H / G query heads of one kv head, times the T queries, form the rows of one query
tile: row ``m = t * R + r``. The packed row count is fixed at ``R * MAX_QUERIES`` rounded up to
``block_m`` (tiles of ``block_m`` rows, padding rows have position -1 and see nothing), so **no
kernel shape depends on T**: a decode step (T = 1) and a speculative verify (T = K + 1) run the same
compiled kernels, and every row's arithmetic (its dot products, its max / sum over keys, its
online-softmax updates, the combine over splits) depends only on that row's query, its position and
the cache. A query's output is therefore bitwise the same in a T = 1 call and as one row of a
T = K + 1 call (``tests/test_decode_attention.py`` checks it).

Work. The cache axis S is cut into splits of ``split_blocks * block_k`` keys (split j covers keys
[j * split_len, (j + 1) * split_len); the boundaries depend on the ``TuningConfig`` only, not on T
and not even on S). Kernel 1 runs one program per (sequence, kv head, row tile, split): an online
softmax over the split's key blocks that returns the partial (unnormalised o, running max m, sum l)
per row. Key blocks (and whole splits) that lie entirely past the largest position of the tile's rows
are never loaded and cost nothing, so the work follows the filled length, not the capacity. Kernel 2
merges, row by row in split order, the partials of the splits that hold a visible key. When S fits
in one split, kernel 1 normalises and writes the output itself and kernel 2 is skipped; a row that
sees only split 0 gets the same bits either way, so a query's output does not depend on the cache
capacity S either (AR and speculative loops may bucket their caches differently).

Mask: key slot ``s`` is visible to query ``(b, t)`` iff ``s <= q_pos[b, t]`` (and ``s < S``). Rows
that see no key return 0. Output: float32 ``[B, T, H, d]``.

Numerics: scores and softmax in float32 (exp2 with the scale folded in), probabilities rounded to
the cache dtype for the PV product (as in the model's XLA reference), float32 accumulation.
The Pallas Triton backend is deprecated upstream (jax 0.11.2 warns); it is what runs here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

MAX_QUERIES = 16       # largest T; it fixes the packed row count R * MAX_QUERIES
_LOG2E = math.log2(math.e)

# jax 0.11 warns at every lowering of a Triton-backend pallas_call; keep model users' output clean.
warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning)


def _pow2(n) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Block sizes and launch parameters. None of them may depend on T (exactness, module doc)."""
    block_m: int = 64      # query rows per program (the packed R * MAX_QUERIES rows, tiled)
    block_k: int = 64      # keys per loop step
    split_blocks: int = 2  # key blocks per split (one program each); S <= one split: no combine
    num_warps: int = 4
    num_stages: int = 2    # Triton software-pipelining depth of the key loop

    def __post_init__(self):
        if not (_pow2(self.block_m) and 16 <= self.block_m <= 128):
            raise ValueError(f"block_m must be a power of two in [16, 128] (a tl.dot tile has >= 16 rows), "
                             f"got {self.block_m}")
        if not (_pow2(self.block_k) and 16 <= self.block_k <= 256):
            raise ValueError(f"block_k must be a power of two in [16, 256], got {self.block_k}")
        if not (isinstance(self.split_blocks, int) and 1 <= self.split_blocks <= 4096):
            raise ValueError(f"split_blocks must be an int in [1, 4096] (key blocks per split), "
                             f"got {self.split_blocks}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if not (isinstance(self.num_stages, int) and 1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be an int in [1, 8], got {self.num_stages}")


def default_config(batch: int, kv_heads: int, group: int, head_dim: int) -> TuningConfig:
    """Untuned guess (``main`` times alternatives): splits of 128 keys while few (b, g, tile)
    programs share the GPU, longer ones as B * G grows. A function of B, G, R and d only: never of
    T (exactness) nor of S (the same query gives the same bits in caches of any capacity)."""
    block_m = min(64, max(16, 1 << (group * MAX_QUERIES - 1).bit_length()))
    programs = batch * kv_heads * -(-group * MAX_QUERIES // block_m)
    split_blocks = min(16, max(2, 1 << (max(programs // 8, 1) - 1).bit_length()))
    return TuningConfig(block_m=block_m, block_k=64, split_blocks=split_blocks,
                        num_warps=8 if head_dim > 128 else 4)


def split_geometry(seq_len: int, cfg: TuningConfig) -> tuple[int, int]:
    """(number of splits, keys per split) of a cache of ``seq_len`` slots."""
    split_len = cfg.split_blocks * cfg.block_k
    return -(-seq_len // split_len), split_len


# ------------------------------------------------------------------------------------- kernels
def _key_block(i, carry, *, q_Md, k_ref, v_ref, pos_M, start, block_k, seq_len, scale_log2):
    """One online-softmax step over keys [start + i*block_k, +block_k) (inside kernel 1)."""
    acc_Md, m_M, l_M = carry
    first = start + i * block_k
    key_K = first + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
    in_cache = key_K < seq_len
    load_mask = jnp.broadcast_to(in_cache[:, None], (block_k, q_Md.shape[1]))
    k_Kd = plgpu.load(k_ref.at[pl.ds(first, block_k), :], mask=load_mask, other=0.0)
    v_Kd = plgpu.load(v_ref.at[pl.ds(first, block_k), :], mask=load_mask, other=0.0)
    s_MK = plgpu.dot(q_Md, k_Kd, trans_b=True) * scale_log2          # log2 domain
    visible = (key_K[None, :] <= pos_M[:, None]) & in_cache[None, :]
    s_MK = jnp.where(visible, s_MK, -jnp.inf)
    m_new = jnp.maximum(m_M, s_MK.max(axis=1))
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)               # rows that saw nothing yet
    alpha = jnp.where(m_new == m_M, 1.0, jnp.exp2(m_M - m_use))    # exactly 1 if the max stayed
    p_MK = jnp.exp2(s_MK - m_use[:, None])                         # masked keys: exp2(-inf) = 0
    l_M = l_M * alpha + p_MK.sum(axis=1)
    acc_Md = acc_Md * alpha[:, None] + plgpu.dot(p_MK.astype(v_Kd.dtype), v_Kd)
    return acc_Md, m_new, l_M


def _normalise(acc_Md, l_M):
    inv = jnp.where(l_M > 0, 1.0 / jnp.where(l_M > 0, l_M, 1.0), 0.0)
    return acc_Md * inv[:, None]


def _last_key(pos_M, seq_len):
    """Last key slot any row of the tile sees (-1 or less: none)."""
    return jnp.minimum(jnp.max(pos_M), seq_len - 1)


def _split_kernel(q_ref, k_ref, v_ref, pos_ref, *out_refs, block_k, split_len, seq_len, scale_log2):
    """Kernel 1: one program = (sequence b, kv head g, row tile i, key split j).

    q_ref [block_m, d], k_ref / v_ref [S, d] (the whole cache row of (b, g); only visited blocks are
    loaded), pos_ref [block_m]. One split: writes o [block_m, d] normalised. Several: a split holding
    no visible key returns at once; others write the partials o [block_m, d] (unnormalised, only rows
    that saw a key), m and l [block_m]."""
    pos_M = pos_ref[...]
    start = pl.program_id(3) * split_len
    n_keys = jnp.clip(_last_key(pos_M, seq_len) + 1 - start, 0, split_len)
    n_blocks = lax.div(n_keys + block_k - 1, block_k)

    def attend():
        q_Md = q_ref[...]
        M, d = q_Md.shape
        init = (jnp.zeros((M, d), jnp.float32), jnp.full((M,), -jnp.inf, jnp.float32),
                jnp.zeros((M,), jnp.float32))
        step = functools.partial(_key_block, q_Md=q_Md, k_ref=k_ref, v_ref=v_ref, pos_M=pos_M, start=start,
                                 block_k=block_k, seq_len=seq_len, scale_log2=scale_log2)
        return lax.fori_loop(0, n_blocks, step, init)

    if len(out_refs) == 1:
        acc_Md, _, l_M = attend()
        out_refs[0][...] = _normalise(acc_Md, l_M)
        return

    @pl.when(n_blocks > 0)
    def _():
        acc_Md, m_M, l_M = attend()
        o_ref, m_ref, l_ref = out_refs
        plgpu.store(o_ref, acc_Md, mask=jnp.broadcast_to((m_M > -jnp.inf)[:, None], acc_Md.shape))
        m_ref[...] = m_M
        l_ref[...] = l_M


def _combine_kernel(pos_ref, o_ref, m_ref, l_ref, out_ref, *, split_len, seq_len):
    """Kernel 2: one program = (b, g, row tile); merges row by row, in split order, the partials of
    the splits kernel 1 ran for this tile (those up to the tile's last visible key).

    pos_ref [block_m]; o_ref [n_splits, block_m, d] (rows a split did not see are unwritten and
    never loaded), m_ref / l_ref [n_splits, block_m]; out_ref [block_m, d] float32."""
    n_active = lax.div(jnp.maximum(_last_key(pos_ref[...], seq_len) + 1, 0) + split_len - 1, split_len)
    M = out_ref.shape[0]
    m_max = lax.fori_loop(0, n_active, lambda j, m: jnp.maximum(m, m_ref[j, :]),
                          jnp.full((M,), -jnp.inf, jnp.float32))
    m_use = jnp.where(m_max == -jnp.inf, 0.0, m_max)

    def merge(j, carry):
        acc_Md, l_M = carry
        m_j = m_ref[j, :]
        w_M = jnp.where(m_j == m_max, 1.0, jnp.exp2(m_j - m_use))  # 0 where split j saw nothing
        seen = jnp.broadcast_to((m_j > -jnp.inf)[:, None], out_ref.shape)
        o_j = plgpu.load(o_ref.at[j], mask=seen, other=0.0)
        return acc_Md + o_j * w_M[:, None], l_M + l_ref[j, :] * w_M

    init = (jnp.zeros(out_ref.shape, jnp.float32), jnp.zeros((M,), jnp.float32))
    acc_Md, l_M = lax.fori_loop(0, n_active, merge, init)
    out_ref[...] = _normalise(acc_Md, l_M)


# ------------------------------------------------------------------------------------- builder
def _build(B: int, G: int, S: int, d: int, rows: int, cfg: TuningConfig, scale: float, interpret: bool):
    """Builder (not a kernel): ``fn(q_BGMd, k_BSGd, v_BSGd, pos_BM) -> o_BGMd`` float32."""
    n_splits, split_len = split_geometry(S, cfg)
    bm, tiles = cfg.block_m, rows // cfg.block_m
    params = plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    in_specs = [pl.BlockSpec((None, None, bm, d), lambda b, g, i, j: (b, g, i, 0)),
                pl.BlockSpec((None, S, None, d), lambda b, g, i, j: (b, 0, g, 0)),
                pl.BlockSpec((None, S, None, d), lambda b, g, i, j: (b, 0, g, 0)),
                pl.BlockSpec((None, bm), lambda b, g, i, j: (b, i))]
    kernel = functools.partial(_split_kernel, block_k=cfg.block_k, split_len=split_len, seq_len=S,
                               scale_log2=scale * _LOG2E)
    out_BGMd = jax.ShapeDtypeStruct((B, G, rows, d), jnp.float32)
    if n_splits == 1:
        return pl.pallas_call(
            kernel, out_shape=out_BGMd, grid=(B, G, tiles, 1), in_specs=in_specs,
            out_specs=pl.BlockSpec((None, None, bm, d), lambda b, g, i, j: (b, g, i, 0)),
            compiler_params=params, interpret=interpret, name="decode_attention")
    partials = pl.pallas_call(
        kernel, grid=(B, G, tiles, n_splits), in_specs=in_specs,
        out_shape=(jax.ShapeDtypeStruct((B, G, n_splits, rows, d), jnp.float32),
                   jax.ShapeDtypeStruct((B, G, n_splits, rows), jnp.float32),
                   jax.ShapeDtypeStruct((B, G, n_splits, rows), jnp.float32)),
        out_specs=(pl.BlockSpec((None, None, None, bm, d), lambda b, g, i, j: (b, g, j, i, 0)),
                   pl.BlockSpec((None, None, None, bm), lambda b, g, i, j: (b, g, j, i)),
                   pl.BlockSpec((None, None, None, bm), lambda b, g, i, j: (b, g, j, i))),
        compiler_params=params, interpret=interpret, name="decode_attention")
    combine = pl.pallas_call(
        functools.partial(_combine_kernel, split_len=split_len, seq_len=S), out_shape=out_BGMd,
        grid=(B, G, tiles),
        in_specs=[pl.BlockSpec((None, bm), lambda b, g, i: (b, i)),
                  pl.BlockSpec((None, None, n_splits, bm, d), lambda b, g, i: (b, g, 0, i, 0)),
                  pl.BlockSpec((None, None, n_splits, bm), lambda b, g, i: (b, g, 0, i)),
                  pl.BlockSpec((None, None, n_splits, bm), lambda b, g, i: (b, g, 0, i))],
        out_specs=pl.BlockSpec((None, None, bm, d), lambda b, g, i: (b, g, i, 0)),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1), interpret=interpret,
        name="decode_attention_combine")
    return lambda q, k, v, pos: combine(pos, *partials(q, k, v, pos))


# ------------------------------------------------------------------------------- entry point
def packed_rows(group: int, block_m: int) -> int:
    """Rows of the packed query array per (b, g): R * MAX_QUERIES rounded up to block_m."""
    return -(-group * MAX_QUERIES // block_m) * block_m


def _pack_queries(q_BTHd, G: int, rows: int):
    """Plain JAX (data movement only): [B,T,H,d] -> [B,G,rows,d], row t*R + r, zero padding rows."""
    B, T, H, d = q_BTHd.shape
    q = q_BTHd.reshape(B, T, G, H // G, d).transpose(0, 2, 1, 3, 4).reshape(B, G, T * (H // G), d)
    return jnp.pad(q, ((0, 0), (0, 0), (0, rows - q.shape[2]), (0, 0)))


def _row_positions(q_pos_BT, R: int, rows: int):
    """Plain JAX: position of each packed row [B, rows]; padding rows get -1 (see nothing)."""
    pos = jnp.repeat(q_pos_BT.astype(jnp.int32), R, axis=1)
    return jnp.pad(pos, ((0, 0), (0, rows - pos.shape[1])), constant_values=-1)


def _check(q, k, v, q_pos):
    (B, T, H, d), (Bk, S, G, dk) = q.shape, k.shape
    if k.shape != v.shape or (Bk, dk) != (B, d) or H % G or q_pos.shape != (B, T) or S < 1:
        raise ValueError(f"expected q [B,T,H,d], k = v [B,S,G,d] with H % G == 0 and S >= 1, q_pos [B,T]; "
                         f"got q {q.shape}, k {k.shape}, v {v.shape}, q_pos {q_pos.shape}")
    if not 1 <= T <= MAX_QUERIES:
        raise ValueError(f"decode attention takes 1..{MAX_QUERIES} queries per sequence, got T={T}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"q, k, v must share dtype bfloat16 or float16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if d not in (64, 128, 256):
        raise ValueError(f"head dim must be 64, 128 or 256, got {d}")


@functools.partial(jax.jit, static_argnames=("scale", "config", "interpret"))
def decode_attention(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, *, scale: float | None = None,
                     config: TuningConfig | None = None, interpret: bool = False):
    """Jitted entry: float32 ``[B, T, H, d]`` attention of T <= 16 queries over the cache.

    ``config`` defaults to ``default_config`` (a function of B, G, R and d: never of T or S).
    ``interpret=True`` runs the kernels in the Pallas interpreter (CPU tests)."""
    _check(q_BTHd, k_BSGd, v_BSGd, q_pos_BT)
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    R = H // G
    cfg = config or default_config(B, G, R, d)
    rows = packed_rows(R, cfg.block_m)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    fn = _build(B, G, S, d, rows, cfg, scale, interpret)
    o_BGMd = fn(_pack_queries(q_BTHd, G, rows), k_BSGd, v_BSGd, _row_positions(q_pos_BT, R, rows))
    o = o_BGMd[:, :, :T * R].reshape(B, G, T, R, d).transpose(0, 2, 1, 3, 4)
    return o.reshape(B, T, H, d)


def decode_attention_reference(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, *, scale: float | None = None,
                               operand_dtype=jnp.float32):
    """Pure jnp (not a kernel), softmax in float32; returns float32 ``[B, T, H, d]``.

    ``operand_dtype`` is the dtype of both matmuls' operands: float32 (default) is the exact
    reference (``Precision.HIGHEST``: no TF32); the cache dtype reproduces the model's XLA attention
    (the benchmark baseline)."""
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    hi = lax.Precision.HIGHEST if jnp.dtype(operand_dtype) == jnp.float32 else None
    q = q_BTHd.astype(operand_dtype).reshape(B, T, G, H // G, d)
    s = jnp.einsum("btgrd,bsgd->bgrts", q, k_BSGd.astype(operand_dtype), precision=hi,
                   preferred_element_type=jnp.float32) * scale
    visible_BTS = jnp.arange(S)[None, None, :] <= q_pos_BT[:, :, None]
    s = jnp.where(visible_BTS[:, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    l = e.sum(-1, keepdims=True)
    p = (e / jnp.where(l > 0, l, 1.0)).astype(operand_dtype)
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v_BSGd.astype(operand_dtype), precision=hi,
                   preferred_element_type=jnp.float32)
    return o.reshape(B, T, H, d)


# ------------------------------------------------------------------------------------ benchmark
def _bench_inputs(B, T, H, G, d, S, dtype=jnp.bfloat16):
    """Random q/k/v; the cache is half full: the T queries are positions S/2 - T .. S/2 - 1."""
    kq, kk, kv = jax.random.split(jax.random.key(B * T + S), 3)
    q = jax.random.normal(kq, (B, T, H, d), dtype)
    k, v = (jax.random.normal(x, (B, S, G, d), dtype) for x in (kk, kv))
    q_pos = jnp.broadcast_to(S // 2 - T + jnp.arange(T, dtype=jnp.int32), (B, T))
    return q, k, v, q_pos


def main(argv=None) -> None:
    """GPU benchmark (not a kernel): median CUPTI kernel time (all kernels of the call, glue
    included) of ``decode_attention`` vs the model's XLA attention (``decode_attention_reference``
    with cache-dtype operands), SmolLM2-135M and Llama-3-8B shapes, bf16, cache half full.
    Also times other ``split_blocks`` (1, 2, 4, 8 and one split for the whole cache) next to the
    default, to tune ``default_config``."""
    import argparse
    import itertools
    import numpy as np
    from jax.experimental.mosaic.gpu import profiler
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=20)
    a = ap.parse_args(argv)

    def us(f, *args):
        _, ms = profiler.measure(f, iterations=a.iterations)(*args)
        return 1000 * float(np.median(ms))

    shapes = {"smollm2": (9, 3, 64), "llama3-8b": (32, 8, 128)}
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}; median of {a.iterations} CUPTI runs, us")
    print("| model | B | T | S | XLA ref us | kernel us | speedup | default split_blocks "
          "| split_blocks 1 / 2 / 4 / 8 / whole us | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, (H, G, d)), B, T, S in itertools.product(shapes.items(), (1, 8), (1, 8), (512, 2048)):
        q, k, v, pos = _bench_inputs(B, T, H, G, d, S)
        cfg = default_config(B, G, H // G, d)
        t_ref = us(jax.jit(functools.partial(decode_attention_reference, operand_dtype=q.dtype)), q, k, v, pos)
        t_k = us(functools.partial(decode_attention, config=cfg), q, k, v, pos)
        alt = [t_k if n == cfg.split_blocks else
               us(functools.partial(decode_attention, config=dataclasses.replace(cfg, split_blocks=n)), q, k, v, pos)
               for n in (1, 2, 4, 8, -(-S // cfg.block_k))]
        o = decode_attention(q, k, v, pos, config=cfg)
        ref = decode_attention_reference(q, k, v, pos)
        err = float(jnp.linalg.norm(o - ref) / jnp.linalg.norm(ref))
        print(f"| {name} | {B} | {T} | {S} | {t_ref:.1f} | {t_k:.1f} | {t_ref / t_k:.2f}x | {cfg.split_blocks} | "
              + " / ".join(f"{t:.1f}" for t in alt) + f" | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
