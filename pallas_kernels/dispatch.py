"""Kernel dispatch for ``specjax.attention.attend`` on Hopper: the kernel's output, or None.

None means "not applicable here, use the reference". Two kernels, both for q [B,T,H,d] against a
k/v cache [B,S,G,d], bf16 or fp16 (q in the cache dtype), H % G == 0. Mask: key slot s is visible
to the query at position q_pos[b, t] iff s <= q_pos[b, t] (slots past a sequence's valid length lie
past its positions, so they are masked by the same rule).

  * T <= 32 (decode T = 1, speculative verify T = K + 1, a draft tree's rows), head dim 64/128, on a GPU backend:
    ``decode_attention`` (Pallas Triton, flash-decoding). Decode and verify run the same kernel
    code on the same tile shapes, so a query's attention output is bitwise the same in both (see
    that module). ``rope_attend_write`` is the model's form of it: q|k|v before RoPE in, RoPE, the
    K/V cache writes and attention in one launch.
  * T >= 2 otherwise (prefill), head dim 64/128/256: the FA3 kernel (``flash_attention``).

A third, for draft trees: ``move_rows`` moves the accepted path's K/V rows into position order in every
layer's cache in one launch (``SPECJAX_MOVE_ROWS=0``: XLA's gather + update per array, for A/B timing).

``SPECJAX_DECODE_KERNEL=0`` turns the decode kernel off (A/B timing): T == 1 then returns None
(the XLA reference runs) and 2 <= T <= 32 goes to FA3, as before the decode kernel existed. The
variable is read when the model is traced; jit caches traced functions, so set it before the
first call (e.g. per process).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.decode_attention import WIDE_QUERIES, decode_attention, rope_attention_write
from pallas_kernels.flash_attention import default_config, key_end
from pallas_kernels.flash_attention_vjp import flash_attention
from pallas_kernels.move_rows import move_rows as move_rows_kernel

MIN_QUERIES = 2  # FA3 (prefill): at least two queries


def _common(q_BTHd, k_BSGd, v_BSGd) -> bool:
    (B, _, H, d), (Bk, S, G, dk) = q_BTHd.shape, k_BSGd.shape
    return (S >= 1 and (Bk, dk) == (B, d) and v_BSGd.shape == k_BSGd.shape and H % G == 0
            and q_BTHd.dtype == k_BSGd.dtype == v_BSGd.dtype
            and q_BTHd.dtype in (jnp.bfloat16, jnp.float16))


def applies(q_BTHd, k_BSGd, v_BSGd) -> bool:
    """Static check (shapes and dtypes only) that the FA3 kernel supports this call."""
    return (q_BTHd.shape[1] >= MIN_QUERIES and q_BTHd.shape[3] in (64, 128, 256)
            and _common(q_BTHd, k_BSGd, v_BSGd))


def _gpu_backend() -> bool:
    return jax.default_backend() == "gpu"


def decode_kernel_enabled() -> bool:
    """False when ``SPECJAX_DECODE_KERNEL=0``, or when the default backend is not a GPU (the
    Triton kernel cannot run elsewhere)."""
    return os.environ.get("SPECJAX_DECODE_KERNEL", "1") != "0" and _gpu_backend()


def applies_decode(q_BTHd, k_BSGd, v_BSGd) -> bool:
    """Static check (shapes and dtypes only) that the decode kernel supports this call."""
    return (1 <= q_BTHd.shape[1] <= WIDE_QUERIES and q_BTHd.shape[3] in (64, 128)
            and _common(q_BTHd, k_BSGd, v_BSGd))


def attend(q_BTHd: jax.Array, k_BSGd: jax.Array, v_BSGd: jax.Array,
           q_pos_BT: jax.Array) -> jax.Array | None:
    """Causal GQA attention over the cache by a Pallas kernel, or None where none applies."""
    if applies_decode(q_BTHd, k_BSGd, v_BSGd) and decode_kernel_enabled():
        return decode_attention(q_BTHd, k_BSGd, v_BSGd, q_pos_BT)
    if not applies(q_BTHd, k_BSGd, v_BSGd):
        return None
    B, T, S = q_BTHd.shape[0], q_BTHd.shape[1], k_BSGd.shape[1]
    kend_BT = key_end(B, T, S, causal="positions", q_pos_BT=q_pos_BT)
    return flash_attention(q_BTHd, k_BSGd, v_BSGd, kend_BT, None,
                           default_config(q_BTHd.shape[3], S, causal=True, mask_array=True))


def tree_bits(visible_TW: np.ndarray) -> np.ndarray | None:
    """int32 [T]: row t's visible slots as bits (bit w: slot base + w; bit 31 is the sign bit), or None if W > 32."""
    T, W = visible_TW.shape
    if W > 32:
        return None
    return (np.asarray(visible_TW, np.int64) << np.arange(W)).sum(axis=1).astype(np.uint32).view(np.int32)


def rope_attend_write(qkv_BTNd: jax.Array, k_BSGd: jax.Array, v_BSGd: jax.Array, cos_BTd: jax.Array,
                      sin_BTd: jax.Array, start_B: jax.Array, n_heads: int, norm: tuple[int, float] | None = None,
                      tree: tuple[np.ndarray, int] | None = None, out_dtype=jnp.float32):
    """A decoder layer's attention over T <= 32 new tokens in one kernel: ``(o, k_BSGd, v_BSGd)`` from
    ``rope_attention_write`` (q|k|v before RoPE, [B, T, H + 2G, d] float32; with ``norm=(D, eps)`` one
    more head of sums of squares, see ``specjax.attention.attend_new_tokens``), or None where the decode
    kernel does not apply (then RoPE, ``cache.write`` and ``attend`` run as separate steps).
    ``tree = (visible_TW, offset)``: draft-tree rows (``specjax.attention.tree_mask``), in the kernel while
    the tree's slots fit its 32 mask bits. ``out_dtype``: o's dtype (``rope_attention_write``)."""
    B, T, N, d = qkv_BTNd.shape
    q_shape = jax.ShapeDtypeStruct((B, T, n_heads, d), k_BSGd.dtype)
    if not (applies_decode(q_shape, k_BSGd, v_BSGd) and decode_kernel_enabled()
            and N == n_heads + 2 * k_BSGd.shape[2] + (norm is not None)):
        return None
    norm_dim, norm_eps = norm if norm is not None else (0, 0.0)
    extra = {}
    if tree is not None:
        bits = tree_bits(tree[0])
        if bits is None or not 0 <= tree[1] <= 32 - T:
            return None
        extra = dict(tree_bits_T=jnp.asarray(bits), tree_offset=int(tree[1]))
    return rope_attention_write(qkv_BTNd, k_BSGd, v_BSGd, cos_BTd, sin_BTd, start_B, n_heads=n_heads,
                                norm_dim=norm_dim, norm_eps=norm_eps, out_dtype=out_dtype, **extra)


def move_rows(arrays: tuple[jax.Array, ...], start_B: jax.Array, rows_BR: jax.Array):
    """``specjax.cache.gather_rows`` for all arrays in one kernel (``pallas_kernels.move_rows``), or None off a
    GPU backend or with ``SPECJAX_MOVE_ROWS=0`` (read at trace time, as ``SPECJAX_DECODE_KERNEL``)."""
    if not _gpu_backend() or os.environ.get("SPECJAX_MOVE_ROWS", "1") == "0":
        return None
    return move_rows_kernel(tuple(arrays), start_B, rows_BR)
