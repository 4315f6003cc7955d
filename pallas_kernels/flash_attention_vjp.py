"""Differentiable flash attention: the Hopper forward kernel and its backward.

The backward runs the Pallas Mosaic GPU kernels of ``flash_attention_bwd`` (dK/dV and dQ; at head dim
256 dV and dK in two passes) at head dims 64, 128 and 256. For other head dims it is NOT a kernel:
``attention_bwd_blocked``, pure JAX, recomputes the probabilities one KV block at a time from the
forward's saved log-sum-exp (no T x S matrix is ever materialised, no second softmax pass):
  p = exp(s - lse), dV = p^T dO, dP = dO V^T, dS = p * (dP - rowsum(dO * O)), dQ = dS K, dK = dS^T Q
in float32, scanned over KV blocks of ``block_kv`` keys; GQA gradients are summed over the query
heads that share a KV head. It is also the kernels' second reference in the tests.
``attention(..., causal=...)`` without lengths takes ``flash_attention_static``: its forward computes the
mask in the kernel (``STATIC_MASKS``); the backward is the same, from the mask's ``k_end`` arrays.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.flash_attention import STATIC_MASKS, TuningConfig, flash_attention_fwd, key_end
from pallas_kernels.flash_attention_bwd import HEAD_DIMS, default_bwd_config, flash_attention_bwd


def attention_bwd_blocked(q_BTHd, k_BSGd, v_BSGd, o_BTHd, lse_BHT, do_BTHd, kend_BT, *,
                          scale: float, block_kv: int = 512):
    """dQ, dK, dV (in the input dtypes) from the saved LSE, one KV block per scan step."""
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    R, f32 = H // G, jnp.float32
    nb = -(-S // block_kv)
    Sp = nb * block_kv
    q = q_BTHd.astype(f32).reshape(B, T, G, R, d)
    do = do_BTHd.astype(f32).reshape(B, T, G, R, d)
    delta_BGRT = jnp.einsum("btgrd,btgrd->bgrt", do, o_BTHd.astype(f32).reshape(B, T, G, R, d))
    lse_BGRT = lse_BHT.reshape(B, G, R, T)
    lse_BGRT = jnp.where(jnp.isfinite(lse_BGRT), lse_BGRT, 0.0)   # rows that saw no key
    blocks = lambda x: jnp.pad(x.astype(f32), ((0, 0), (0, Sp - S), (0, 0), (0, 0))) \
        .reshape(B, nb, block_kv, G, d).swapaxes(0, 1)
    cols = jnp.arange(Sp, dtype=jnp.int32).reshape(nb, block_kv)

    def step(dq, xs):
        k_b, v_b, col = xs
        s = jnp.einsum("btgrd,bsgd->bgrts", q, k_b) * scale
        visible = (col[None, None, :] < kend_BT[:, :, None])[:, None, None]
        p = jnp.where(visible, jnp.exp(s - lse_BGRT[..., None]), 0.0)
        dv = jnp.einsum("bgrts,btgrd->bsgd", p, do)
        dp = jnp.einsum("btgrd,bsgd->bgrts", do, v_b)
        ds = p * (dp - delta_BGRT[..., None]) * scale
        dq = dq + jnp.einsum("bgrts,bsgd->btgrd", ds, k_b)
        dk = jnp.einsum("bgrts,btgrd->bsgd", ds, q)
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros_like(q), (blocks(k_BSGd), blocks(v_BSGd), cols))
    unblock = lambda x: x.swapaxes(0, 1).reshape(B, Sp, G, d)[:, :S]
    return (dq.reshape(B, T, H, d).astype(q_BTHd.dtype), unblock(dk).astype(k_BSGd.dtype),
            unblock(dv).astype(v_BSGd.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def flash_attention(q_BTHd, k_BSGd, v_BSGd, kend_BT, scale: float | None = None,
                    config: TuningConfig | None = None):
    """Attention output [B,T,H,d]; key s visible to row t of batch b iff s < kend_BT[b, t]."""
    return flash_attention_fwd(q_BTHd, k_BSGd, v_BSGd, kend_BT, scale=scale, config=config)[0]


def _fwd(q, k, v, kend, scale, config):
    o, lse = flash_attention_fwd(q, k, v, kend, scale=scale, config=config)
    return o, (q, k, v, o, lse, kend)


def _grads(q, k, v, o, lse, do, kend, scale, config):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if q.shape[-1] in HEAD_DIMS:  # the kernels; interpretable where the forward's config is
        bwd_config = default_bwd_config(q.shape[-1], interpretable=bool(config and config.interpretable))
        return flash_attention_bwd(q, k, v, o, lse, do, kend, scale=scale, config=bwd_config)
    return attention_bwd_blocked(q, k, v, o, lse, do, kend, scale=scale)


def _bwd(scale, config, res, do):
    q, k, v, o, lse, kend = res
    return *_grads(q, k, v, o, lse, do, kend, scale, config), np.zeros(kend.shape, jax.dtypes.float0)


flash_attention.defvjp(_fwd, _bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def flash_attention_static(q_BTHd, k_BSGd, v_BSGd, causal: str, scale: float | None = None,
                           config: TuningConfig | None = None):
    """``flash_attention`` with a static mask (``STATIC_MASKS``): the forward computes it in the
    kernel (``flash_attention_fwd(..., causal=...)``), the backward takes its ``k_end`` arrays."""
    return flash_attention_fwd(q_BTHd, k_BSGd, v_BSGd, causal=causal, scale=scale, config=config)[0]


def _static_fwd(q, k, v, causal, scale, config):
    o, lse = flash_attention_fwd(q, k, v, causal=causal, scale=scale, config=config)
    return o, (q, k, v, o, lse)


def _static_bwd(causal, scale, config, res, do):
    q, k, v, o, lse = res
    kend = key_end(q.shape[0], q.shape[1], k.shape[1], causal=causal)
    return _grads(q, k, v, o, lse, do, kend, scale, config)


flash_attention_static.defvjp(_static_fwd, _static_bwd)


def attention(q_BTHd, k_BSGd, v_BSGd, *, causal: str = "none", kv_lens_B=None, q_lens_B=None,
              scale: float | None = None, config: TuningConfig | None = None):
    """Convenience entry: builds ``k_end`` from a causal mode and optional per-sequence lengths;
    without lengths the mask is static (``flash_attention_static``: computed in the forward kernel)."""
    if kv_lens_B is None and q_lens_B is None and causal in STATIC_MASKS:
        return flash_attention_static(q_BTHd, k_BSGd, v_BSGd, causal, scale, config)
    B, T, S = q_BTHd.shape[0], q_BTHd.shape[1], k_BSGd.shape[1]
    kend = key_end(B, T, S, causal=causal, kv_lens_B=kv_lens_B, q_lens_B=q_lens_B)
    return flash_attention(q_BTHd, k_BSGd, v_BSGd, kend, scale, config)
