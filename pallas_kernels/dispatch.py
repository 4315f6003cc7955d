"""Kernel dispatch for ``specjax.attention.attend`` on Hopper: the kernel's output, or None.

None means "not applicable here, use the reference". The kernel applies to the model's prefill and
verify calls: q [B,T,H,d] with T >= 2, k/v cache [B,S,G,d], bf16 or fp16, head dim 64/128/256,
H % G == 0. Mask: key slot s is visible to the query at position q_pos[b, t] iff s <= q_pos[b, t]
(slots past a sequence's valid length lie past its positions, so they are masked by the same rule).
Decode (T == 1) returns None: the kernel spends a 128-row query tile on one row, and no
measurement shows it faster than the reference there (none was made).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.flash_attention import key_end
from pallas_kernels.flash_attention_vjp import flash_attention

MIN_QUERIES = 2


def applies(q_BTHd, k_BSGd, v_BSGd) -> bool:
    """Static check (shapes and dtypes only) that the kernel supports this call."""
    (B, T, H, d), (Bk, S, G, dk) = q_BTHd.shape, k_BSGd.shape
    return (T >= MIN_QUERIES and S >= 1 and (Bk, dk) == (B, d) and v_BSGd.shape == k_BSGd.shape
            and d in (64, 128, 256) and H % G == 0
            and q_BTHd.dtype == k_BSGd.dtype == v_BSGd.dtype
            and q_BTHd.dtype in (jnp.bfloat16, jnp.float16))


def attend(q_BTHd: jax.Array, k_BSGd: jax.Array, v_BSGd: jax.Array,
           q_pos_BT: jax.Array) -> jax.Array | None:
    """Causal GQA attention over the cache by the FA3 kernel, or None where it does not apply."""
    if not applies(q_BTHd, k_BSGd, v_BSGd):
        return None
    B, T, S = q_BTHd.shape[0], q_BTHd.shape[1], k_BSGd.shape[1]
    kend_BT = key_end(B, T, S, causal="positions", q_pos_BT=q_pos_BT)
    return flash_attention(q_BTHd, k_BSGd, v_BSGd, kend_BT)
