"""Small pure building blocks: RMSNorm, rotary embeddings (with Llama-3 scaling), the matmul, SwiGLU."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig, check_compute_dtype


def inv_rms(x_BTD: jax.Array, eps: float) -> jax.Array:
    """1 / rms over the last axis, float32, keepdims: RMSNorm's statistic."""
    x32 = x_BTD.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


def rms_norm(x_BTD: jax.Array, w_D: jax.Array, eps: float) -> jax.Array:
    """HF-exact RMSNorm: statistics in float32, scale applied after casting back."""
    y = x_BTD.astype(jnp.float32) * inv_rms(x_BTD, eps)
    return w_D * y.astype(x_BTD.dtype)


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Rotary inverse frequencies [d/2] in float32, with Llama-3 scaling if configured."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.rope_scaling
    if rs is not None:
        low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
        high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
        wavelen = 2 * math.pi / inv
        smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
            rs.high_freq_factor - rs.low_freq_factor)
        scaled = np.where(wavelen > low_wavelen, inv / rs.factor, inv)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv = np.where(mid, (1 - smooth) * inv / rs.factor + smooth * inv, scaled)
    return inv.astype(np.float32)


def rope_tables(cfg: ModelConfig, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [B, T, d] in float32 for HF's rotate-half convention."""
    ang = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_frequencies(cfg))
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x_BTNd: jax.Array, cos_BTd: jax.Array, sin_BTd: jax.Array) -> jax.Array:
    half = x_BTNd.shape[-1] // 2
    rot = jnp.concatenate([-x_BTNd[..., half:], x_BTNd[..., :half]], axis=-1)
    cos = cos_BTd[:, :, None, :].astype(x_BTNd.dtype)
    sin = sin_BTd[:, :, None, :].astype(x_BTNd.dtype)
    return x_BTNd * cos + rot * sin


def linear(x_BTI: jax.Array, w_OI: jax.Array, compute_dtype: str = "param") -> jax.Array:
    """``x @ w.T`` for a weight stored ``[out, in]`` (HF/PyTorch layout), float32 out.

    ``compute_dtype="param"``: the operands are in the weight's dtype and the products accumulate in
    float32, which is also the output dtype: activations stay float32 between matmuls even with bf16
    weights, but are rounded to bf16 on the way into each matmul.
    ``compute_dtype="float32"``: the float32 activation meets the weight upcast to float32 inside the
    jitted product (the stored weight keeps its dtype; the convert is left to XLA to fuse into the
    matmul), at ``Precision.HIGHEST`` so GPUs do not use TF32. A forward over K+1 tokens (verify) and
    over one token (decode) then differ only by float32 rounding (``ModelConfig.compute_dtype``).

    At decode (one row per sequence) XLA turns this product into a reduction over ``in``; with the
    ``[out, in]`` layout that reduction runs over contiguous memory (1.9x faster than ``[in, out]``
    for SmolLM2's matmuls on an H200, benchmarks/NOTES.md)."""
    if compute_dtype == "float32":
        return jnp.einsum("...i,oi->...o", x_BTI.astype(jnp.float32), w_OI.astype(jnp.float32),
                          precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    check_compute_dtype(compute_dtype)  # trace time only
    return jnp.einsum("...i,oi->...o", x_BTI.astype(w_OI.dtype), w_OI, preferred_element_type=jnp.float32)


def swiglu(x_BTD: jax.Array, w_gate_up_2FD: jax.Array, w_down_DF: jax.Array, compute_dtype: str = "param",
           scale_BT1: jax.Array | float = 1.0) -> jax.Array:
    """down(silu(gate(x) * scale) * up(x) * scale); ``scale`` lets a caller apply a norm's 1/rms after
    the gate/up matmul (``norm_swiglu``)."""
    gate, up = jnp.split(linear(x_BTD, w_gate_up_2FD, compute_dtype), 2, axis=-1)
    return linear(jax.nn.silu(gate * scale_BT1) * (up * scale_BT1), w_down_DF, compute_dtype)


def norm_swiglu(x_BTD: jax.Array, w_norm_D: jax.Array, eps: float, w_gate_up_2FD: jax.Array, w_down_DF: jax.Array,
                compute_dtype: str = "param") -> jax.Array:
    """``swiglu(rms_norm(x))`` with the norm's 1/rms applied to the gate/up outputs instead of their input
    (the same value: the matmul is linear). The matmul's input, x * w, then needs no reduction first, so
    XLA fuses it into the gate/up kernel: one kernel less per layer at decode (an H100: 30 kernels and
    11.5 us fewer per SmolLM2 step, benchmarks/NOTES.md item 13). In bf16 the operand rounded on the way
    into the matmul is x * w instead of x * w / rms: the same relative rounding, other bits."""
    return swiglu(w_norm_D * x_BTD, w_gate_up_2FD, w_down_DF, compute_dtype, inv_rms(x_BTD, eps))
