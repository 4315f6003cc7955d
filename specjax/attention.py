"""Grouped-query attention over the KV cache: the pure-JAX reference, and the Hopper dispatch.

``attend`` is what the model calls. On Hopper GPUs it uses the Pallas kernels in
``pallas_kernels/`` where they apply; everywhere else (and whenever
``SPECJAX_ATTENTION=reference``) it runs ``attention_reference``.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from specjax import cache as kv
from specjax.config import check_compute_dtype
from specjax.layers import apply_rope, inv_rms_from_sumsq


def attention_reference(q_BTHd: jax.Array, k_BSGd: jax.Array, v_BSGd: jax.Array,
                        q_pos_BT: jax.Array, kv_pos_BS: jax.Array | None = None,
                        compute_dtype: str = "param", mask_BTS: jax.Array | None = None) -> jax.Array:
    """Causal GQA attention: query at position p sees key slots s with kv_pos[s] <= p
    (or, given ``mask_BTS``, the slots where it is True: a draft tree's rows, see ``tree_mask``).

    Scores and softmax in float32; returns [B, T, H, d] in float32. ``compute_dtype="param"`` rounds
    the queries and the probabilities to the cache dtype before the two matmuls; ``"float32"`` keeps
    q, scores and probabilities in float32 and upcasts K/V from the cache inside the products
    (``Precision.HIGHEST``), see ``ModelConfig.compute_dtype``.
    """
    B, T, H, d = q_BTHd.shape
    S, G = k_BSGd.shape[1], k_BSGd.shape[2]
    if check_compute_dtype(compute_dtype) == "float32":
        op_dtype, precision = jnp.float32, jax.lax.Precision.HIGHEST
    else:
        op_dtype, precision = k_BSGd.dtype, None
    q = q_BTHd.astype(op_dtype).reshape(B, T, G, H // G, d)
    s_BGRTS = jnp.einsum("btgrd,bsgd->bgrts", q, k_BSGd.astype(op_dtype), precision=precision,
                         preferred_element_type=jnp.float32)
    s_BGRTS = s_BGRTS * (1.0 / jnp.sqrt(jnp.float32(d)))
    if kv_pos_BS is None:
        kv_pos_BS = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    if mask_BTS is None:
        mask_BTS = kv_pos_BS[:, None, :] <= q_pos_BT[:, :, None]
    s_BGRTS = jnp.where(mask_BTS[:, None, None], s_BGRTS, -jnp.inf)
    p = jax.nn.softmax(s_BGRTS, axis=-1).astype(op_dtype)
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v_BSGd.astype(op_dtype), precision=precision,
                   preferred_element_type=jnp.float32)
    return o.reshape(B, T, H, d)


def _dispatch():
    """``pallas_kernels.dispatch`` on a Hopper GPU (unless ``SPECJAX_ATTENTION=reference``), else None."""
    if not _use_kernels():
        return None
    try:
        from pallas_kernels import dispatch
    except ImportError:
        return None
    return dispatch


def _use_kernels() -> bool:
    if os.environ.get("SPECJAX_ATTENTION", "auto") == "reference":
        return False
    try:
        dev = jax.devices()[0]
    except RuntimeError:
        return False
    return dev.platform == "gpu" and getattr(dev, "compute_capability", "") in ("9.0", "9.0a")


def tree_mask(visible_TW: jax.Array, base_B: jax.Array, capacity: int) -> jax.Array:
    """bool [B, T, S]: row t sees every slot before ``base_B`` (the context) and slot ``base_B + w`` where
    ``visible_TW[t, w]`` (the tree's rows written from ``base_B`` on: its ancestors and itself)."""
    T, W = visible_TW.shape
    rel_BS = jnp.arange(capacity, dtype=jnp.int32)[None, :] - base_B[:, None]
    inside_BTS = jnp.take(jnp.asarray(visible_TW), jnp.clip(rel_BS, 0, W - 1), axis=1).transpose(1, 0, 2)
    return ((rel_BS < 0)[:, None, :]) | (inside_BTS & (rel_BS < W)[:, None, :])


def attend(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, compute_dtype: str = "param", mask_BTS=None):
    """The model's attention entry point (kernel dispatch happens here, nowhere else).

    With ``compute_dtype="float32"`` q stays float32, so the bf16/fp16 kernels do not apply
    (``pallas_kernels.dispatch.applies`` needs q in the cache dtype) and the float32 reference runs.
    An explicit ``mask_BTS`` (tree rows) always runs the reference: the kernels mask by position only."""
    dispatch = _dispatch() if mask_BTS is None else None
    if dispatch is not None:
        q_op = q_BTHd.astype(jnp.float32 if compute_dtype == "float32" else k_BSGd.dtype)
        out = dispatch.attend(q_op, k_BSGd, v_BSGd, q_pos_BT)
        if out is not None:
            return out.astype(jnp.float32)
    return attention_reference(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, compute_dtype=compute_dtype, mask_BTS=mask_BTS)


def attend_new_tokens(qkv_BTNd, k_BSGd, v_BSGd, cos_BTd, sin_BTd, start_B, n_heads: int,
                      compute_dtype: str = "param", norm: tuple[int, float] | None = None, tree=None,
                      out_dtype=jnp.float32):
    """A decoder layer's attention over T new tokens per sequence (positions ``start_B[b] + t``):
    RoPE on q and k, k and v written into the caches at ``start_B``, causal attention.

    ``qkv_BTNd`` is the q|k|v projection [B, T, H + 2G, d] (float32, before RoPE); returns
    ``(o [B, T, H, d], k_BSGd, v_BSGd)``, o float32 or rounded to ``out_dtype`` (the o projection's operand
    dtype: the kernel then stores it so, and no convert kernel runs before the o GEMM). With ``norm=(D, eps)``
    it has one more head, [B, T, H + 2G + 1, d], whose entries are each token's sum of squares over the D
    elements of the layer's input (``layers.linear_sumsq``), and q|k|v are those of the input not yet divided
    by its rms: every token's q|k|v is first scaled by RMSNorm's 1/rms (the matmul is linear, so this is the
    norm). On Hopper with T <= 32 (decode, verify, tree rows) and ``compute_dtype="param"`` the steps run as one
    kernel (``pallas_kernels.dispatch.rope_attend_write``); the code below is their definition and runs
    everywhere else. ``tree = (visible_TW, offset)``: the rows are draft-tree nodes (their positions, in
    cos/sin, are not their slots); the causal mask becomes ``tree_mask(visible_TW, start_B - offset)`` (the
    kernel takes it as bits while the tree's slots number <= 32)."""
    dispatch = _dispatch()
    if dispatch is not None and compute_dtype == "param":
        out = dispatch.rope_attend_write(qkv_BTNd, k_BSGd, v_BSGd, cos_BTd, sin_BTd, start_B, n_heads, norm, tree,
                                         out_dtype=out_dtype)
        if out is not None:
            return out
    mask_BTS = None if tree is None else tree_mask(tree[0], start_B - tree[1], k_BSGd.shape[1])
    if norm is not None:
        qkv_BTNd = qkv_BTNd[:, :, :-1] * inv_rms_from_sumsq(qkv_BTNd[:, :, -1:, :1], *norm)
    G = (qkv_BTNd.shape[2] - n_heads) // 2
    q_BTHd = apply_rope(qkv_BTNd[:, :, :n_heads], cos_BTd, sin_BTd)
    k_BSGd = kv.write(k_BSGd, apply_rope(qkv_BTNd[:, :, n_heads:n_heads + G], cos_BTd, sin_BTd), start_B)
    v_BSGd = kv.write(v_BSGd, qkv_BTNd[:, :, n_heads + G:], start_B)
    q_pos_BT = start_B[:, None] + jnp.arange(qkv_BTNd.shape[1], dtype=jnp.int32)[None, :]
    o_BTHd = attend(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, compute_dtype, mask_BTS).astype(out_dtype)
    return o_BTHd, k_BSGd, v_BSGd
