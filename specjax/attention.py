"""Grouped-query attention over the KV cache: the pure-JAX reference, and the Hopper dispatch.

``attend`` is what the model calls. On Hopper GPUs it uses the Pallas kernels in
``pallas_kernels/`` where they apply; everywhere else (and whenever
``SPECJAX_ATTENTION=reference``) it runs ``attention_reference``.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from specjax.config import check_compute_dtype


def attention_reference(q_BTHd: jax.Array, k_BSGd: jax.Array, v_BSGd: jax.Array,
                        q_pos_BT: jax.Array, kv_pos_BS: jax.Array | None = None,
                        compute_dtype: str = "param") -> jax.Array:
    """Causal GQA attention: query at position p sees key slots s with kv_pos[s] <= p.

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
    mask_BTS = kv_pos_BS[:, None, :] <= q_pos_BT[:, :, None]
    s_BGRTS = jnp.where(mask_BTS[:, None, None], s_BGRTS, -jnp.inf)
    p = jax.nn.softmax(s_BGRTS, axis=-1).astype(op_dtype)
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v_BSGd.astype(op_dtype), precision=precision,
                   preferred_element_type=jnp.float32)
    return o.reshape(B, T, H, d)


def _use_kernels() -> bool:
    if os.environ.get("SPECJAX_ATTENTION", "auto") == "reference":
        return False
    try:
        dev = jax.devices()[0]
    except RuntimeError:
        return False
    return dev.platform == "gpu" and getattr(dev, "compute_capability", "") in ("9.0", "9.0a")


def attend(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, compute_dtype: str = "param"):
    """The model's attention entry point (kernel dispatch happens here, nowhere else).

    With ``compute_dtype="float32"`` q stays float32, so the bf16/fp16 kernels do not apply
    (``pallas_kernels.dispatch.applies`` needs q in the cache dtype) and the float32 reference runs."""
    if _use_kernels():
        try:
            from pallas_kernels import dispatch
        except ImportError:
            dispatch = None
        if dispatch is not None:
            q_op = q_BTHd.astype(jnp.float32 if compute_dtype == "float32" else k_BSGd.dtype)
            out = dispatch.attend(q_op, k_BSGd, v_BSGd, q_pos_BT)
            if out is not None:
                return out.astype(jnp.float32)
    return attention_reference(q_BTHd, k_BSGd, v_BSGd, q_pos_BT, compute_dtype=compute_dtype)
