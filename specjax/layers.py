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
    return inv_rms_from_sumsq(jnp.sum(x32 * x32, axis=-1, keepdims=True), x_BTD.shape[-1], eps)


def inv_rms_from_sumsq(sumsq: jax.Array, dim: int, eps: float) -> jax.Array:
    """RMSNorm's 1/rms from a sum of squares over ``dim`` elements (float32); also what ``linear_sumsq``'s
    folded norms use."""
    return jax.lax.rsqrt(sumsq.astype(jnp.float32) / dim + eps)


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


def operand_dtype(w_OI: jax.Array, compute_dtype: str = "param"):
    """The dtype ``linear(x, w, compute_dtype)`` rounds its input ``x`` to: the weight's, or float32. A producer
    that rounds to it already (the attention kernel's output) changes no bit and spares XLA a convert."""
    return jnp.dtype(jnp.float32 if compute_dtype == "float32" else w_OI.dtype)


def one_row(x_BTI: jax.Array) -> bool:
    """Whether ``x`` holds a single row (B * T == 1): a decode step at B=1, where XLA computes each
    matmul as a reduction over ``in`` rather than a GEMM."""
    return x_BTI.size == x_BTI.shape[-1]


MLP_SUMSQ_COPIES = 64  # rows of sum(x**2) appended to the gate/up reduction (probe: benchmarks/NOTES.md item 20)
FOLD_MAX_IN = 2048  # fold a norm into a one-row matmul only up to this input width (same item)


def fold_norm(x_BTI: jax.Array, w_OI: jax.Array, compute_dtype: str = "param") -> bool:
    """Whether to take an RMSNorm's statistic from the next matmul's reduction (``linear_sumsq``): at one
    row, ``compute_dtype="param"``, and an input width (the model width) of at most ``FOLD_MAX_IN``.
    Measured on an H200 at B=1 (benchmarks/NOTES.md item 20), every norm folded against none: faster at
    widths 576 (SmolLM2-135M: 0.557 vs 0.608 ms/token), 960 and 2048 (Llama-3.2-1B shape: 0.98 vs
    1.02-1.04), slower at 4096 (Llama-3-8B shape: 5.94 vs 4.88). The bound is fitted to those four
    shapes, not derived."""
    return compute_dtype == "param" and one_row(x_BTI) and w_OI.shape[-1] <= FOLD_MAX_IN


def linear_sumsq(x_BTI: jax.Array, w_OI: jax.Array, s_BTI: jax.Array, copies: int = 1) -> jax.Array:
    """One row's ``x @ w.T`` followed by ``copies`` copies of ``sum(s ** 2)``, float32 ``[..., O + copies]``,
    written as ONE reduction over ``in`` (used where ``fold_norm`` holds: one row, ``compute_dtype="param"``).

    Why: at one row XLA runs the matmul as a reduction over ``in`` anyway; the sum of squares of an
    RMSNorm's input is one more row of that reduction, so the norm's statistic costs no kernel of its
    own (a decode step of SmolLM2 ran one ~1.3 us reduction kernel per norm, two per layer). The matmul
    operand is rounded to the weight's dtype and the products summed in float32, as in ``linear``."""
    x = x_BTI.astype(w_OI.dtype).astype(jnp.float32)
    s = s_BTI.astype(jnp.float32)
    sq = jnp.broadcast_to((s * s)[..., None, :], s.shape[:-1] + (copies, s.shape[-1]))
    return jnp.sum(jnp.concatenate([x[..., None, :] * w_OI.astype(jnp.float32), sq], axis=-2), axis=-1)


def swiglu(x_BTD: jax.Array, w_gate_up_2FD: jax.Array, w_down_DF: jax.Array, compute_dtype: str = "param",
           scale_BT1: jax.Array | float = 1.0) -> jax.Array:
    """down(silu(gate(x) * scale) * up(x) * scale); ``scale`` lets a caller apply a norm's 1/rms after
    the gate/up matmul (``norm_swiglu``)."""
    return swiglu_down(linear(x_BTD, w_gate_up_2FD, compute_dtype), w_down_DF, compute_dtype, scale_BT1)


def swiglu_down(gate_up_BT2F: jax.Array, w_down_DF: jax.Array, compute_dtype: str = "param",
                scale_BT1: jax.Array | float = 1.0) -> jax.Array:
    """The rest of ``swiglu`` from the gate/up products: down(silu(gate * scale) * up * scale)."""
    gate, up = jnp.split(gate_up_BT2F, 2, axis=-1)
    return linear(jax.nn.silu(gate * scale_BT1) * (up * scale_BT1), w_down_DF, compute_dtype)


def norm_swiglu(x_BTD: jax.Array, w_norm_D: jax.Array, eps: float, w_gate_up_2FD: jax.Array, w_down_DF: jax.Array,
                compute_dtype: str = "param") -> jax.Array:
    """``swiglu(rms_norm(x))``. At one row the norm's 1/rms is applied to the gate/up outputs instead of their
    input (the same value: the matmul is linear). The matmul's input, x * w, then needs no reduction first, so
    XLA fuses it into the gate/up kernel: one kernel less per layer at decode (an H100: 30 kernels and
    11.5 us fewer per SmolLM2 step, benchmarks/NOTES.md item 13). In bf16 the operand rounded on the way
    into the matmul is x * w instead of x * w / rms: the same relative rounding, other bits. Where ``fold_norm``
    holds, the statistic itself comes out of the gate/up reduction (``linear_sumsq``).
    Several rows (a verify forward, a prefill) take the norm first, as the attention's norm is: XLA then fuses the
    residual add before it into the norm's kernel (SmolLM2 verify forward at T = 5-8: ~2 % faster than the
    1/rms after the GEMM, benchmarks/NOTES.md items 41 and 48)."""
    if fold_norm(x_BTD, w_gate_up_2FD, compute_dtype):  # the norm's statistic inside the gate/up reduction
        F = w_gate_up_2FD.shape[0] // 2
        out = linear_sumsq(w_norm_D * x_BTD, w_gate_up_2FD, x_BTD, copies=MLP_SUMSQ_COPIES)
        scale = inv_rms_from_sumsq(out[..., 2 * F:2 * F + 1], x_BTD.shape[-1], eps)
        return swiglu_down(out[..., :2 * F], w_down_DF, compute_dtype, scale)
    if not one_row(x_BTD):
        return swiglu(rms_norm(x_BTD, w_norm_D, eps), w_gate_up_2FD, w_down_DF, compute_dtype)
    return swiglu(w_norm_D * x_BTD, w_gate_up_2FD, w_down_DF, compute_dtype, inv_rms(x_BTD, eps))
