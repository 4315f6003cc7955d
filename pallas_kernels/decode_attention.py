"""Decode / verify attention: a few queries (T = 1..32) against a KV cache, in Pallas on the Triton
backend, flash-decoding style.

Layout. The R = H / G query heads of one kv head, times the T queries, form the rows of one query
tile: row ``m = t * R + r``. The packed row count is fixed at ``R * MAX_QUERIES`` rounded up to
``block_m`` (tiles of ``block_m`` rows, padding rows have position -1 and see nothing; calls of
17..32 queries, a draft tree's verify, pack ``R * WIDE_QUERIES`` rows: more tiles of the same shape), so **no
tile shape depends on T**: a decode step (T = 1) and a speculative verify (T = K + 1) run the same
kernel code on the same tiles (a tile gathers its query rows straight from the caller's array and
scatters its output rows into ``[B, T, H, d]``: no packing copies around the kernel; only those
addresses depend on T), and every row's arithmetic (its dot products, its max / sum over keys, its
online-softmax updates, the combine over splits) depends only on that row's query, its position and
the cache. A query's output is therefore bitwise the same in a T = 1 call and as one row of a
T = K + 1 call (``tests/test_decode_attention.py`` checks it).

Work. The cache axis S is cut into splits of ``split_blocks * block_k`` keys (split j covers keys
[j * split_len, (j + 1) * split_len); the boundaries depend on the ``TuningConfig`` only, not on T
and not even on S). Kernel 1 runs one program per (sequence, kv head, row tile, split): an online
softmax over the split's key blocks that returns the partial (unnormalised o, running max m, sum l)
per row. Key blocks (and whole splits) that lie entirely past the largest position of the tile's rows
are never loaded, so the work follows the filled length, not the capacity. Exception, for latency:
with one key block per split (``split_blocks=1``, the default for small B * G) a program loads and
computes its block before the positions arrive (keys past them are masked) and only its stores wait
on them; splits past the filled length then cost a masked block each, in parallel. Kernel 2 (one
program per ``COMBINE_ROWS`` packed rows, so a verify's rows spread over several programs) merges, row
by row in split order, the partials of the splits that hold a visible key (its loop over splits
unrolled by ``SPLITS_PER_STEP``, so their loads overlap). When S fits
in one split, kernel 1 normalises and writes the output itself and kernel 2 is skipped; a row that
sees only split 0 gets the same bits either way, so a query's output does not depend on the cache
capacity S either (AR and speculative loops may bucket their caches differently).

Fused form (``rope_attention_write``, what the model calls). The source rows are the layer's q|k|v
projection before RoPE: the kernel rotates q, computes this call's T new K/V rows itself (RoPE on
k), uses them in place of the cache's rows at their slots, and one program per (b, g) writes them
into the caches, which are aliased to outputs (in place). RoPE + two cache writes + attention are
then one launch (two with the combine) instead of ~6 (benchmarks/NOTES.md item 12). Norm mode
(``norm_dim > 0``, the model's one-row decode steps): the layer's RMSNorm is folded in as well; each
token's source rows end with a row of its sum of squares, and the kernel scales q|k|v by 1/rms before
RoPE (benchmarks/NOTES.md item 20).

Mask: key slot ``s`` is visible to query ``(b, t)`` iff ``s <= q_pos[b, t]`` (and ``s < S``). Rows
that see no key return 0. Output: float32 ``[B, T, H, d]``. Draft trees (fused form, ``tree_bits``): the
T new tokens are tree nodes written at consecutive slots, and a query also needs, among the slots from
``base = start - tree_offset`` on, bit ``s - base`` of its ``tree_bits[t]`` (its ancestors and itself);
slots before ``base`` are the context and stay visible (``rope_attention_write``).

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

MAX_QUERIES = 16       # largest T of the usual layout; it fixes the packed row count R * MAX_QUERIES
WIDE_QUERIES = 32      # largest T: calls of 17..32 queries pack R * WIDE_QUERIES rows (more tiles, same shape)
COMBINE_ROWS = 8       # packed rows per program of the combine kernel (divides every block_m)
SPLITS_PER_STEP = 16   # the combine kernel's merge loop over splits is unrolled by this factor
MAX_SPLITS_PER_STEP = 32  # ... and its max pass (it loads only m) by this one
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
    """Splits of one 64-key block while fewer than 64 (b, g, tile) programs share the GPU, longer
    ones as B * G grows. A function of B, G, R and d only: never of T (exactness) nor of S (the same
    query gives the same bits in caches of any capacity). Fitted to one H200 call
    (benchmarks/results/decode_H200_2026-11-26_split_log.txt, SmolLM2 shape, 512-slot cache):
    64-key splits gave 0.694 ms/token at B=1 (3 programs) against 0.736-0.746 with 128-key splits
    and 0.809 with 512, and 0.822 at B=8 (24 programs) against 0.938-0.944 with 256-key splits.
    Short programs in parallel beat a long serial key loop even with the combine kernel. At
    2048 slots and B=1 the micro-benchmark (``main``) favoured 128-key splits (7.8 vs 9.4 us)."""
    block_m = min(64, max(16, 1 << (group * MAX_QUERIES - 1).bit_length()))
    programs = batch * kv_heads * -(-group * MAX_QUERIES // block_m)
    split_blocks = min(16, 1 << (max(programs // 32, 1) - 1).bit_length())
    return TuningConfig(block_m=block_m, block_k=64, split_blocks=split_blocks,
                        num_warps=8 if head_dim > 128 else 4)


def split_geometry(seq_len: int, cfg: TuningConfig) -> tuple[int, int]:
    """(number of splits, keys per split) of a cache of ``seq_len`` slots."""
    split_len = cfg.split_blocks * cfg.block_k
    return -(-seq_len // split_len), split_len


# ------------------------------------------------------------------------------------- kernels
@dataclasses.dataclass(frozen=True)
class _Layout:
    """Static geometry of one call, shared by the kernels (not a tuning knob)."""
    T: int            # queries per sequence
    H: int            # query heads
    G: int            # kv heads
    N: int            # head rows per token in the source array: H (q), or H + 2G (fused q|k|v)
    S: int            # cache slots
    d: int            # head dim
    block_m: int
    block_k: int
    split_len: int    # keys per split (``split_geometry``)
    n_splits: int     # splits of the S slots; 1: kernel 1 writes the output, no combine
    scale_log2: float
    fused: bool       # source is q|k|v before RoPE: rotate, substitute new keys, write them to the cache
    norm_dim: int = 0     # fused, > 0: each token's last source row holds the sum of squares of the layer's
    norm_eps: float = 0.0  # input over norm_dim elements; q|k|v are scaled by rsqrt(sum / norm_dim + eps)
    tree_offset: int = -1  # fused, >= 0: a draft tree's rows, masked by a bits input from start - tree_offset on
    max_queries: int = MAX_QUERIES  # the packed rows: R * max_queries (WIDE_QUERIES when T > MAX_QUERIES)

    @property
    def R(self) -> int:
        return self.H // self.G


def _tile_rows(L: _Layout, g, i, rows: int | None = None):
    """Packed rows ``m = t * R + r`` of tile i (of ``rows`` rows, default ``block_m``) of kv head g: (t clamped
    to a valid query, the row of that query in the source array, the row of its output in ``[T * H, d]``,
    valid = t < T)."""
    rows = L.block_m if rows is None else rows
    m = i * rows + lax.broadcasted_iota(jnp.int32, (rows,), 0)
    t, r = m // L.R, m % L.R
    valid = t < L.T
    t = jnp.where(valid, t, 0)
    return t, t * L.N + g * L.R + r, t * L.H + g * L.R + r, valid


def _rows2d(mask_M, d):
    return jnp.broadcast_to(mask_M[:, None], (mask_M.shape[0], d))


def _at_rows(ref, row_M, col_d=None):
    """``ref`` [rows, d] at rows ``row_M`` (and columns ``col_d``, default all): a gather/scatter
    view indexed by integer arrays in both dims (the form the interpreter also runs)."""
    col_d = lax.broadcasted_iota(jnp.int32, (ref.shape[-1],), 0) if col_d is None else col_d
    return ref.at[row_M[:, None], col_d[None, :]]


def _store_rows(ref, row_M, val_Md, mask_M):
    """Masked scatter of rows. Masked rows get an out-of-range index as well: the GPU skips them by
    the mask, the interpreter's scatter drops them (a clamped duplicate index could win there)."""
    row_M = jnp.where(mask_M, row_M, ref.shape[0])
    plgpu.store(_at_rows(ref, row_M), val_Md.astype(ref.dtype), mask=_rows2d(mask_M, val_Md.shape[1]))


def _row_scale(src_ref, L: _Layout, t_M, mask_M):
    """Fused-norm mode (``L.norm_dim > 0``): RMSNorm's 1/rms of queries ``t_M``, from the row that ends
    each token's N source rows (its d entries all hold the token's sum of squares; the max picks it
    exactly). None otherwise."""
    if not L.norm_dim:
        return None
    ss_M = plgpu.load(_at_rows(src_ref, t_M * L.N + L.N - 1), mask=_rows2d(mask_M, L.d), other=0.0).max(axis=1)
    return lax.rsqrt(ss_M / L.norm_dim + L.norm_eps)


def _rope_rows(src_ref, cos_ref, sin_ref, row_M, t_M, mask_M, d, scale_M=None):
    """HF rotate-half RoPE of source rows ``row_M`` at the positions of queries ``t_M`` (float32):
    x * cos + rotate_half(x) * sin, rotate_half(x)[c] = -x[c + d/2] (c < d/2), x[c - d/2] (else);
    the rows are first scaled by ``scale_M`` if given (``_row_scale``)."""
    col = lax.broadcasted_iota(jnp.int32, (d,), 0)
    rot = jnp.where(col < d // 2, col + d // 2, col - d // 2)
    sign = jnp.where(col < d // 2, -1.0, 1.0).astype(jnp.float32)
    mask = _rows2d(mask_M, d)
    x = plgpu.load(_at_rows(src_ref, row_M), mask=mask, other=0.0).astype(jnp.float32)
    x_rot = plgpu.load(_at_rows(src_ref, row_M, rot), mask=mask, other=0.0).astype(jnp.float32)
    if scale_M is not None:
        x, x_rot = x * scale_M[:, None], x_rot * scale_M[:, None]
    cos, sin = plgpu.load(_at_rows(cos_ref, t_M)), plgpu.load(_at_rows(sin_ref, t_M))
    return x * cos + (x_rot * sign[None, :]) * sin


def _new_rows(refs, L: _Layout, g, t_M, mask_M, dtype):
    """This call's K and V rows for kv head g at queries ``t_M`` (fused mode), in the cache dtype."""
    src_ref, cos_ref, sin_ref = refs
    scale_M = _row_scale(src_ref, L, t_M, mask_M)
    k = _rope_rows(src_ref, cos_ref, sin_ref, t_M * L.N + L.H + g, t_M, mask_M, L.d, scale_M)
    v = plgpu.load(_at_rows(src_ref, t_M * L.N + L.H + L.G + g), mask=_rows2d(mask_M, L.d), other=0.0)
    if scale_M is not None:
        v = v * scale_M[:, None]
    return k.astype(dtype), v.astype(dtype)


def _key_block(i, carry, *, q_Md, k_ref, v_ref, pos_M, start, L: _Layout, new, tree=None):
    """One online-softmax step over keys [start + i*block_k, +block_k) (inside kernel 1). ``new``
    (fused mode: (refs, g, first new slot)) replaces the cache's rows of this call's tokens by the
    K/V computed here, so no kernel reads a row while another writes it. ``tree`` (bits per row, base
    slot): a key at or past the base also needs its bit."""
    acc_Md, m_M, l_M = carry
    first = start + i * L.block_k
    key_K = first + lax.broadcasted_iota(jnp.int32, (L.block_k,), 0)
    in_cache = key_K < L.S
    k_Kd = plgpu.load(k_ref.at[pl.ds(first, L.block_k), :], mask=_rows2d(in_cache, L.d), other=0.0)
    v_Kd = plgpu.load(v_ref.at[pl.ds(first, L.block_k), :], mask=_rows2d(in_cache, L.d), other=0.0)
    if new is not None:
        refs, g, slot0 = new
        t_K = key_K - slot0
        is_new = (t_K >= 0) & (t_K < L.T)

        def merge():
            k_new, v_new = _new_rows(refs, L, g, jnp.where(is_new, t_K, 0), is_new, k_Kd.dtype)
            return (jnp.where(_rows2d(is_new, L.d), k_new, k_Kd), jnp.where(_rows2d(is_new, L.d), v_new, v_Kd))
        k_Kd, v_Kd = lax.cond((first < slot0 + L.T) & (first + L.block_k > slot0), merge, lambda: (k_Kd, v_Kd))
    s_MK = plgpu.dot(q_Md, k_Kd, trans_b=True) * L.scale_log2        # log2 domain
    visible = (key_K[None, :] <= pos_M[:, None]) & in_cache[None, :]
    if tree is not None:
        bits_M, base = tree
        rel_K = key_K - base
        bit_MK = lax.shift_right_arithmetic(bits_M[:, None], jnp.clip(rel_K, 0, 31)[None, :]) & 1
        visible = visible & ((rel_K[None, :] < 0) | (bit_MK == 1))
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


def _write_new_rows(refs, k_out_ref, v_out_ref, L: _Layout, g, slot0, dtype):
    """Fused mode, one program per (b, g): the T new K/V rows into cache slots slot0 .. slot0+T-1."""
    t = lax.broadcasted_iota(jnp.int32, (L.max_queries,), 0)
    ok = (t < L.T) & (slot0 + t < L.S)
    t = jnp.where(ok, t, 0)
    k_new, v_new = _new_rows(refs, L, g, t, ok, dtype)
    _store_rows(k_out_ref, slot0 + t, k_new, ok)
    _store_rows(v_out_ref, slot0 + t, v_new, ok)


def _split_kernel(*refs, L: _Layout):
    """Kernel 1: one program = (sequence b, kv head g, row tile i, key split j).

    Inputs: src [T * N, d] (the queries, or q|k|v before RoPE), pos [T], (fused: cos, sin [T, d]),
    k / v [S, d] (the whole cache row of (b, g); only blocks up to the tile's last key are loaded, or, with
    one block per split, each program's block). Outputs: one split:
    o [T * H, d] float32, this tile's rows written, normalised; several: partials o [block_m, d]
    (unnormalised, only rows that saw a key), m and l [block_m], a split holding no visible key
    storing nothing. Fused mode adds the caches (aliased to the inputs); program (b, g, 0, 0)
    writes the new rows."""
    bits_ref = None
    if L.fused and L.tree_offset >= 0:
        src_ref, pos_ref, cos_ref, sin_ref, k_ref, v_ref, bits_ref, *out_refs, k_out_ref, v_out_ref = refs
    elif L.fused:
        src_ref, pos_ref, cos_ref, sin_ref, k_ref, v_ref, *out_refs, k_out_ref, v_out_ref = refs
    else:
        (src_ref, pos_ref, k_ref, v_ref, *out_refs), cos_ref = refs, None
    g, i, j = pl.program_id(1), pl.program_id(2), pl.program_id(3)
    t_M, src_M, dst_M, valid_M = _tile_rows(L, g, i)
    pos_M = jnp.where(valid_M, plgpu.load(pos_ref.at[t_M]), -1)
    start = j * L.split_len
    n_keys = jnp.clip(_last_key(pos_M, L.S) + 1 - start, 0, L.split_len)
    n_blocks = lax.div(n_keys + L.block_k - 1, L.block_k)
    new = tree = None
    if L.fused:
        slot0, rope = pos_ref[0], (src_ref, cos_ref, sin_ref)
        new = (rope, g, slot0)
        if bits_ref is not None:
            tree = (jnp.where(valid_M, plgpu.load(bits_ref.at[t_M]), 0), slot0 - L.tree_offset)

        @pl.when((i == 0) & (j == 0))
        def _():
            _write_new_rows(rope, k_out_ref, v_out_ref, L, g, slot0, k_ref.dtype)

    def attend():
        if L.fused:
            q_Md = _rope_rows(src_ref, cos_ref, sin_ref, src_M, t_M, valid_M, L.d,
                              _row_scale(src_ref, L, t_M, valid_M)).astype(k_ref.dtype)
        else:
            q_Md = plgpu.load(_at_rows(src_ref, src_M), mask=_rows2d(valid_M, L.d), other=0.0)
        M = q_Md.shape[0]
        init = (jnp.zeros((M, L.d), jnp.float32), jnp.full((M,), -jnp.inf, jnp.float32),
                jnp.zeros((M,), jnp.float32))
        step = functools.partial(_key_block, q_Md=q_Md, k_ref=k_ref, v_ref=v_ref, pos_M=pos_M, start=start,
                                 L=L, new=new, tree=tree)
        if one_block:  # its loads need not wait for the positions (keys past them are masked anyway)
            return step(0, init)
        return lax.fori_loop(0, n_blocks, step, init)

    def store_partials(acc_Md, m_M, l_M):
        o_ref, m_ref, l_ref = out_refs
        plgpu.store(o_ref, acc_Md, mask=_rows2d(m_M > -jnp.inf, L.d))
        m_ref[...] = m_M
        l_ref[...] = l_M

    one_block = L.split_len == L.block_k
    if L.n_splits == 1:
        acc_Md, _, l_M = attend()
        _store_rows(out_refs[0], dst_M, _normalise(acc_Md, l_M), valid_M)
    elif one_block:  # a split past the tile's last key computes a masked block and stores nothing
        partials = attend()
        pl.when(n_blocks > 0)(lambda: store_partials(*partials))
    else:  # a split past the tile's last key returns at once
        pl.when(n_blocks > 0)(lambda: store_partials(*attend()))


def _combine_kernel(pos_ref, o_ref, m_ref, l_ref, out_ref, *, L: _Layout):
    """Kernel 2: one program = (b, g, chunk of ``COMBINE_ROWS`` packed rows); merges row by row, in split
    order, the partials of the splits kernel 1 ran for the chunk's tile (those up to its last visible key).
    A chunk with no valid row (t >= T) returns at once.

    pos_ref [T]; o_ref [n_splits, COMBINE_ROWS, d] (rows a split did not see are unwritten: loaded, then
    replaced by 0), m_ref / l_ref [n_splits, COMBINE_ROWS]; out_ref [T * H, d] float32 (the chunk's rows)."""
    M = COMBINE_ROWS
    c = pl.program_id(2)
    t_M, _, dst_M, valid_M = _tile_rows(L, pl.program_id(1), c, M)

    @pl.when(c * M < L.T * L.R)
    def _():
        # Splits past the chunk's last key hold nothing for its rows (m = -inf where kernel 1 ran them).
        pos_M = jnp.where(valid_M, plgpu.load(pos_ref.at[t_M]), -1)
        n_active = lax.div(jnp.maximum(_last_key(pos_M, L.S) + 1, 0) + L.split_len - 1, L.split_len)
        n_live = jnp.minimum(n_active, L.n_splits)

        def stats(j):  # split j's (m, l) per row; a split kernel 1 did not run counts as having seen nothing
            live = jnp.broadcast_to(j < n_live, (M,))
            jj = jnp.minimum(j, L.n_splits - 1)
            return (plgpu.load(m_ref.at[jj], mask=live, other=-jnp.inf),
                    plgpu.load(l_ref.at[jj], mask=live, other=0.0))

        def merge(j, carry):
            acc_Md, l_M = carry
            m_j, l_j = stats(j)
            w_M = jnp.where(m_j == m_max, 1.0, jnp.exp2(m_j - m_use))  # 0 where split j saw nothing
            # The rows' loads wait only for the positions, not for m_j (one memory round trip per step, not
            # two); rows split j did not see hold unwritten memory and are replaced by 0 (the old masked load's
            # value, so the sum has the same bits).
            live = _rows2d(valid_M & (j < n_live), L.d)
            o_j = plgpu.load(o_ref.at[jnp.minimum(j, L.n_splits - 1)], mask=live, other=0.0)
            o_j = jnp.where(_rows2d(m_j > -jnp.inf, L.d), o_j, 0.0)
            return acc_Md + o_j * w_M[:, None], l_M + l_j * w_M

        # Splits in chunks, unrolled inside a loop whose trip count is static: their loads issue together, and
        # caches of any capacity run the same loop body (same bits; only the trip count differs). The max pass
        # loads only m (COMBINE_ROWS floats per split), so it takes wider chunks.
        def over_splits(body, per_step):
            return lambda s, carry: functools.reduce(lambda x, i: body(s * per_step + i, x), range(per_step), carry)

        m_max = lax.fori_loop(0, -(-L.n_splits // MAX_SPLITS_PER_STEP),
                              over_splits(lambda j, m: jnp.maximum(m, stats(j)[0]), MAX_SPLITS_PER_STEP),
                              jnp.full((M,), -jnp.inf, jnp.float32))
        m_use = jnp.where(m_max == -jnp.inf, 0.0, m_max)
        init = (jnp.zeros((M, L.d), jnp.float32), jnp.zeros((M,), jnp.float32))
        acc_Md, l_M = lax.fori_loop(0, -(-L.n_splits // SPLITS_PER_STEP), over_splits(merge, SPLITS_PER_STEP),
                                    init)
        _store_rows(out_ref, dst_M, _normalise(acc_Md, l_M), valid_M)


# ------------------------------------------------------------------------------------- builder
def _build(B: int, L: _Layout, cfg: TuningConfig, interpret: bool, out_dtype=jnp.float32):
    """Builder (not a kernel): ``fn(src, pos, [cos, sin,] k, v[, tree bits]) -> o [B, T*H, d]`` in ``out_dtype``
    (the float32 result rounded once, in the last kernel's store), plus the updated caches in fused mode."""
    n_splits = L.n_splits
    tiles = packed_rows(L.R, L.block_m, L.max_queries) // L.block_m
    params = plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    per_b = lambda *shape: pl.BlockSpec((None, *shape), lambda b, g, i, j: (b,) + (0,) * len(shape))
    cache_spec = pl.BlockSpec((None, L.S, None, L.d), lambda b, g, i, j: (b, 0, g, 0))
    in_specs = [per_b(L.T * L.N, L.d), per_b(L.T)] + ([per_b(L.T, L.d)] * 2 if L.fused else []) + [cache_spec] * 2
    if L.tree_offset >= 0:
        in_specs.append(pl.BlockSpec((L.T,), lambda b, g, i, j: (0,)))
    o_shape = jax.ShapeDtypeStruct((B, L.T * L.H, L.d), out_dtype)
    if n_splits == 1:
        out_shape, out_specs = [o_shape], [per_b(L.T * L.H, L.d)]
    else:
        rows = tiles * L.block_m
        out_shape = [jax.ShapeDtypeStruct((B, L.G, n_splits, rows, L.d), jnp.float32),
                     jax.ShapeDtypeStruct((B, L.G, n_splits, rows), jnp.float32),
                     jax.ShapeDtypeStruct((B, L.G, n_splits, rows), jnp.float32)]
        out_specs = [pl.BlockSpec((None, None, None, L.block_m, L.d), lambda b, g, i, j: (b, g, j, i, 0)),
                     pl.BlockSpec((None, None, None, L.block_m), lambda b, g, i, j: (b, g, j, i)),
                     pl.BlockSpec((None, None, None, L.block_m), lambda b, g, i, j: (b, g, j, i))]
    aliases = {}
    if L.fused:  # the caches: written in place (inputs 4, 5 -> the last two outputs)
        aliases = {4: len(out_shape), 5: len(out_shape) + 1}
        out_specs = out_specs + [cache_spec] * 2
    split = functools.partial(
        pl.pallas_call, functools.partial(_split_kernel, L=L), grid=(B, L.G, tiles, n_splits),
        in_specs=in_specs, out_specs=out_specs, input_output_aliases=aliases, compiler_params=params,
        interpret=interpret, name="decode_attention")
    C = COMBINE_ROWS
    combine = pl.pallas_call(
        functools.partial(_combine_kernel, L=L), out_shape=o_shape, grid=(B, L.G, tiles * L.block_m // C),
        in_specs=[pl.BlockSpec((None, L.T), lambda b, g, c: (b, 0)),
                  pl.BlockSpec((None, None, n_splits, C, L.d), lambda b, g, c: (b, g, 0, c, 0)),
                  pl.BlockSpec((None, None, n_splits, C), lambda b, g, c: (b, g, 0, c)),
                  pl.BlockSpec((None, None, n_splits, C), lambda b, g, c: (b, g, 0, c))],
        out_specs=pl.BlockSpec((None, L.T * L.H, L.d), lambda b, g, c: (b, 0, 0)),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1), interpret=interpret,
        name="decode_attention_combine")

    def fn(src, pos, *rest):
        caches = rest[2:4] if L.fused else rest[-2:]
        shapes = out_shape + ([jax.ShapeDtypeStruct(c.shape, c.dtype) for c in caches] if L.fused else [])
        outs = split(out_shape=shapes)(src, pos, *rest)
        o = outs[0] if n_splits == 1 else combine(pos, *outs[:3])
        return (o, *outs[len(out_shape):]) if L.fused else o
    return fn


# ------------------------------------------------------------------------------- entry points
def packed_rows(group: int, block_m: int, max_queries: int = MAX_QUERIES) -> int:
    """Rows of the packed query tiles per (b, g): R * max_queries rounded up to block_m."""
    return -(-group * max_queries // block_m) * block_m


def _check(q_shape, k, v, q_dtype):
    """q_shape [B, T, H, d] of the queries (H = query heads), k = v [B, S, G, d]."""
    (B, T, H, d), (Bk, S, G, dk) = q_shape, k.shape
    if k.shape != v.shape or (Bk, dk) != (B, d) or H % G or S < 1:
        raise ValueError(f"expected queries [B,T,H,d], k = v [B,S,G,d] with H % G == 0 and S >= 1; "
                         f"got queries {q_shape}, k {k.shape}, v {v.shape}")
    if not 1 <= T <= WIDE_QUERIES:
        raise ValueError(f"decode attention takes 1..{WIDE_QUERIES} queries per sequence, got T={T}")
    if not (q_dtype == k.dtype == v.dtype) or k.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"q, k, v must share dtype bfloat16 or float16, got {q_dtype}, {k.dtype}, {v.dtype}")
    if d not in (64, 128, 256):
        raise ValueError(f"head dim must be 64, 128 or 256, got {d}")


def _check_out_dtype(out_dtype):
    if jnp.dtype(out_dtype) not in (jnp.float32, jnp.bfloat16, jnp.float16):
        raise ValueError(f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    return jnp.dtype(out_dtype)


def _layout(B, T, H, G, N, S, d, config, scale, fused, norm_dim=0, norm_eps=0.0, tree_offset=-1):
    cfg = config or default_config(B, G, H // G, d)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    n_splits, split_len = split_geometry(S, cfg)
    L = _Layout(T=T, H=H, G=G, N=N, S=S, d=d, block_m=cfg.block_m, block_k=cfg.block_k, split_len=split_len,
                n_splits=n_splits, scale_log2=scale * _LOG2E, fused=fused, norm_dim=norm_dim, norm_eps=norm_eps,
                tree_offset=tree_offset, max_queries=MAX_QUERIES if T <= MAX_QUERIES else WIDE_QUERIES)
    return L, cfg


@functools.partial(jax.jit, static_argnames=("scale", "config", "interpret"))
def decode_attention(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, *, scale: float | None = None,
                     config: TuningConfig | None = None, interpret: bool = False):
    """Jitted entry: float32 ``[B, T, H, d]`` attention of T <= 32 queries over the cache.

    ``config`` defaults to ``default_config`` (a function of B, G, R and d: never of T or S).
    ``interpret=True`` runs the kernels in the Pallas interpreter (CPU tests)."""
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    _check(q_BTHd.shape, k_BSGd, v_BSGd, q_BTHd.dtype)
    if q_pos_BT.shape != (B, T):
        raise ValueError(f"q_pos must be [B, T] = {(B, T)}, got {q_pos_BT.shape}")
    L, cfg = _layout(B, T, H, G, H, S, d, config, scale, fused=False)
    o = _build(B, L, cfg, interpret)(q_BTHd.reshape(B, T * H, d), q_pos_BT.astype(jnp.int32), k_BSGd, v_BSGd)
    return o.reshape(B, T, H, d)


@functools.partial(jax.jit, static_argnames=("n_heads", "scale", "config", "interpret", "norm_dim", "norm_eps",
                                             "tree_offset", "out_dtype"))
def rope_attention_write(qkv_BTNd, k_BSGd, v_BSGd, cos_BTd, sin_BTd, start_B, *, n_heads: int,
                         scale: float | None = None, config: TuningConfig | None = None,
                         interpret: bool = False, norm_dim: int = 0, norm_eps: float = 0.0,
                         tree_bits_T: jax.Array | None = None, tree_offset: int = 0, out_dtype=jnp.float32):
    """Jitted entry, one launch (two with several splits) for a decoder layer's attention over T <= 32
    new tokens per sequence: ``qkv_BTNd`` [B, T, H + 2G, d] is the q|k|v projection before RoPE
    (float32; heads in HF order), ``cos_BTd`` / ``sin_BTd`` the rotate-half tables of positions
    ``start_B[b] + t``. The kernel applies RoPE to q and k, writes k and v (in the cache dtype) into
    slots ``start_B[b] + t`` of the caches (in place when XLA can donate them) and attends causally.
    Returns ``(o float32 [B, T, H, d], k_BSGd, v_BSGd)``: the same values as RoPE, ``cache.write``
    and ``decode_attention`` in sequence (``rope_attention_write_reference``), and a query's output
    has the same bits as from ``decode_attention`` given the same roped, rounded q and caches.
    ``out_dtype`` (float32, bfloat16 or float16) rounds o in the kernel's store: the bits of
    ``o.astype(out_dtype)``, without the convert kernel XLA would run before a GEMM (the model's o
    projection rounds its operand to the weights' dtype anyway; benchmarks/NOTES.md item 41).

    ``norm_dim > 0`` (RMSNorm folded in, ``specjax.attention.attend_new_tokens(norm=...)``): qkv has one
    more head, [B, T, H + 2G + 1, d], holding each token's sum of squares over the ``norm_dim`` elements of
    the layer's input in all d entries, and the kernel scales the token's q|k|v rows by
    ``rsqrt(sum / norm_dim + norm_eps)`` before RoPE.

    ``tree_bits_T`` (int32 [T]; draft-tree rows, e.g. ``specjax.speculative.tree``): query t sees a slot s at
    or past ``start - tree_offset`` only where bit ``s - start + tree_offset`` of ``tree_bits_T[t]`` is set
    (bits 0..31: its ancestors' slots and its own); cos/sin carry the rows' own positions (their depth)."""
    (B, T, N, d), (S, G) = qkv_BTNd.shape, k_BSGd.shape[1:3]
    H, extra = n_heads, int(norm_dim > 0)
    if norm_dim < 0 or (norm_dim and not norm_eps > 0):
        raise ValueError(f"norm_dim must be 0 (no norm) or the norm's width with norm_eps > 0; got "
                         f"norm_dim={norm_dim}, norm_eps={norm_eps}")
    if (N != H + 2 * G + extra or cos_BTd.shape != (B, T, d) or sin_BTd.shape != (B, T, d)
            or start_B.shape != (B,)):
        want = "H+2G+1 (the last head: sums of squares)" if extra else "H+2G"
        raise ValueError(f"expected qkv [B,T,{want},d] with H={H}, G={G}, cos = sin [B,T,d] = {(B, T, d)}, "
                         f"start [B]; got qkv {qkv_BTNd.shape}, cos {cos_BTd.shape}, sin {sin_BTd.shape}, "
                         f"start {start_B.shape}")
    _check((B, T, H, d), k_BSGd, v_BSGd, k_BSGd.dtype)
    out_dtype = _check_out_dtype(out_dtype)
    if tree_bits_T is not None and (tree_bits_T.shape != (T,) or not 0 <= tree_offset <= 32 - T):
        raise ValueError(f"tree_bits must be [T] = [{T}] with 0 <= tree_offset and tree_offset + T <= 32 (bits "
                         f"0..31); got {tree_bits_T.shape}, tree_offset={tree_offset}")
    L, cfg = _layout(B, T, H, G, N, S, d, config, scale, fused=True, norm_dim=norm_dim, norm_eps=norm_eps,
                     tree_offset=-1 if tree_bits_T is None else tree_offset)
    q_pos_BT = start_B.astype(jnp.int32)[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    bits_in = () if tree_bits_T is None else (jnp.asarray(tree_bits_T, jnp.int32),)
    o, k_BSGd, v_BSGd = _build(B, L, cfg, interpret, out_dtype)(
        qkv_BTNd.astype(jnp.float32).reshape(B, T * N, d), q_pos_BT, cos_BTd.astype(jnp.float32),
        sin_BTd.astype(jnp.float32), k_BSGd, v_BSGd, *bits_in)
    return o.reshape(B, T, H, d), k_BSGd, v_BSGd


def rope_attention_write_reference(qkv_BTNd, k_BSGd, v_BSGd, cos_BTd, sin_BTd, start_B, *, n_heads: int,
                                   scale: float | None = None, norm_dim: int = 0, norm_eps: float = 0.0,
                                   tree_bits_T=None, tree_offset: int = 0, out_dtype=jnp.float32):
    """Pure jnp (not a kernel): (with ``norm_dim``: the scaling by 1/rms,) RoPE, cache writes, then
    ``decode_attention_reference`` with cache-dtype operands (what the model's XLA path computes), with
    the tree mask when ``tree_bits_T`` is given; o rounded to ``out_dtype``."""
    H, d = n_heads, qkv_BTNd.shape[-1]
    x = qkv_BTNd.astype(jnp.float32)
    if norm_dim:
        x = x[:, :, :-1] * lax.rsqrt(x[:, :, -1:, :1] / norm_dim + norm_eps)
    G = (x.shape[2] - H) // 2
    rope = lambda a: a * cos_BTd[:, :, None] + jnp.concatenate([-a[..., d // 2:], a[..., :d // 2]], -1) * sin_BTd[:, :, None]
    q, k, v = rope(x[:, :, :H]), rope(x[:, :, H:H + G]), x[:, :, H + G:]
    T = q.shape[1]
    write = jax.vmap(lambda c, new, s: lax.dynamic_update_slice(c, new.astype(c.dtype), (s, 0, 0)))
    k_BSGd, v_BSGd = write(k_BSGd, k, start_B), write(v_BSGd, v, start_B)
    q_pos_BT = start_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    tree = None if tree_bits_T is None else (tree_bits_T, start_B - tree_offset)
    o = decode_attention_reference(q.astype(k_BSGd.dtype), k_BSGd, v_BSGd, q_pos_BT, scale=scale,
                                   operand_dtype=k_BSGd.dtype, tree=tree)
    return o.astype(out_dtype), k_BSGd, v_BSGd


def decode_attention_reference(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, *, scale: float | None = None,
                               operand_dtype=jnp.float32, tree=None):
    """Pure jnp (not a kernel), softmax in float32; returns float32 ``[B, T, H, d]``. ``tree``: (bits [T],
    base [B]): from slot ``base`` on, a key also needs its bit (see the module doc).

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
    if tree is not None:
        bits_T, base_B = tree
        rel_BS = jnp.arange(S)[None, :] - base_B[:, None]
        bit_BTS = (jnp.asarray(bits_T)[None, :, None] >> jnp.clip(rel_BS, 0, 31)[:, None, :]) & 1
        visible_BTS = visible_BTS & ((rel_BS < 0)[:, None, :] | (bit_BTS == 1))
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
    """Random q|k|v (before RoPE), caches, rope tables; the cache is half full: the T new tokens are
    positions S/2 - T .. S/2 - 1."""
    kq, kk, kv = jax.random.split(jax.random.key(B * T + S), 3)
    qkv = jax.random.normal(kq, (B, T, H + 2 * G, d), jnp.float32)
    k, v = (jax.random.normal(x, (B, S, G, d), dtype) for x in (kk, kv))
    start = jnp.full((B,), S // 2 - T, jnp.int32)
    ang = (start[:, None] + jnp.arange(T))[..., None] / 10000.0 ** (jnp.arange(0, d, 2) / d)
    ang = jnp.concatenate([ang, ang], -1).astype(jnp.float32)
    return qkv, k, v, jnp.cos(ang), jnp.sin(ang), start


def main(argv=None) -> None:
    """GPU benchmark (not a kernel): median CUPTI time (all kernels of the call, glue included) of a
    layer's attention over T new tokens: the XLA path (RoPE, two cache writes, attention:
    ``rope_attention_write_reference``) vs the fused kernel ``rope_attention_write`` with the default
    config and with other ``split_blocks`` (1, 2, 4, 8 and one split for the whole cache), and the
    plain ``decode_attention`` (queries already roped) with the default config. SmolLM2-135M and
    Llama-3-8B shapes, bf16, cache half full."""
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
    print("| model | B | T | S | XLA path us | fused us | XLA / fused | plain kernel us | default split_blocks "
          "| fused, split_blocks 1 / 2 / 4 / 8 / whole us | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, (H, G, d)), B, T, S in itertools.product(shapes.items(), (1, 8), (1, 8), (512, 2048)):
        args = _bench_inputs(B, T, H, G, d, S)
        cfg = default_config(B, G, H // G, d)
        fused = lambda c: functools.partial(rope_attention_write, n_heads=H, config=c)
        t_ref = us(jax.jit(functools.partial(rope_attention_write_reference, n_heads=H)), *args)
        t_k = us(fused(cfg), *args)
        o, k, v = rope_attention_write_reference(*args, n_heads=H)
        q = jax.random.normal(jax.random.key(0), (B, T, H, d), k.dtype)
        q_pos = args[-1][:, None] + jnp.arange(T, dtype=jnp.int32)[None]
        t_plain = us(functools.partial(decode_attention, config=cfg), q, k, v, q_pos)
        alt = [t_k if n == cfg.split_blocks else us(fused(dataclasses.replace(cfg, split_blocks=n)), *args)
               for n in (1, 2, 4, 8, -(-S // cfg.block_k))]
        got = rope_attention_write(*args, n_heads=H, config=cfg)[0]
        err = float(jnp.linalg.norm(got - o) / jnp.linalg.norm(o))
        print(f"| {name} | {B} | {T} | {S} | {t_ref:.1f} | {t_k:.1f} | {t_ref / t_k:.2f}x | {t_plain:.1f} | "
              f"{cfg.split_blocks} | " + " / ".join(f"{t:.1f}" for t in alt) + f" | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
