"""Logits -> probabilities (temperature, top-k, top-p), shared by decoding and verification.

``SamplingParams`` is a pytree of traced scalars, so changing temperature/top-k/top-p values never
recompiles. temperature == 0 means greedy: ``probs`` then returns the one-hot argmax. Which path runs
(greedy or sampling; top-k/top-p filtering or none) is fixed on the host, as two static fields, so a
decode loop has no ``lax.cond`` per step: on an H200 the one that chose greedy per step cost 40 us of
a 0.68 ms step (``benchmarks/NOTES.md`` item 18). Switching paths compiles a second program.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: jax.Array  # float32 scalar, 0 = greedy
    top_k: jax.Array  # int32 scalar, 0 = off
    top_p: jax.Array  # float32 scalar in (0, 1], 1 = off
    is_greedy: bool = dataclasses.field(default=False, metadata=dict(static=True))  # temperature == 0
    is_filtered: bool = dataclasses.field(default=False, metadata=dict(static=True))  # top-k or top-p on

    @staticmethod
    def make(temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> "SamplingParams":
        validate(temperature, top_k, top_p)
        return SamplingParams(jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p),
                              is_greedy=temperature == 0, is_filtered=top_k > 0 or top_p < 1)


def validate(temperature: float, top_k: int, top_p: float) -> None:
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")


def _top_k_top_p(x_NV: jax.Array, sp: SamplingParams) -> jax.Array:
    V = x_NV.shape[-1]
    sorted_desc = -jnp.sort(-x_NV, axis=-1)
    k = jnp.where(sp.top_k > 0, jnp.minimum(sp.top_k, V), V)
    kth = jnp.take_along_axis(sorted_desc, jnp.broadcast_to(k - 1, x_NV.shape[:-1] + (1,)), axis=-1)
    x_NV = jnp.where(x_NV < kth, -jnp.inf, x_NV)
    # top-p on the top-k-filtered distribution: keep the smallest prefix whose mass reaches p
    sorted_desc = jnp.where(jnp.arange(V) < k, sorted_desc, -jnp.inf)
    p_sorted = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(p_sorted, axis=-1) - p_sorted
    cutoff = jnp.min(jnp.where(mass_before < sp.top_p, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(x_NV < cutoff, -jnp.inf, x_NV)


def filtered_logits(logits_NV: jax.Array, sp: SamplingParams) -> jax.Array:
    """Temperature-scaled logits with tokens outside top-k / top-p set to -inf (float32).

    The vocabulary sort runs only when top-k or top-p is on (``sp.is_filtered``)."""
    x = logits_NV.astype(jnp.float32) / jnp.maximum(sp.temperature, 1e-6)
    return _top_k_top_p(x, sp) if sp.is_filtered else x


def probs(logits_NV: jax.Array, sp: SamplingParams) -> jax.Array:
    """The distribution tokens are drawn from: softmax of filtered logits, or one-hot argmax if greedy."""
    if sp.is_greedy:
        return jax.nn.one_hot(jnp.argmax(logits_NV, axis=-1), logits_NV.shape[-1], dtype=jnp.float32)
    return jax.nn.softmax(filtered_logits(logits_NV, sp), axis=-1)


def sample(key: jax.Array, logits_NV: jax.Array, sp: SamplingParams) -> jax.Array:
    """Draw one token per row (argmax when greedy). Returns int32."""
    if sp.is_greedy:
        return jnp.argmax(logits_NV, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, filtered_logits(logits_NV, sp), axis=-1).astype(jnp.int32)


def sample_from_probs(key: jax.Array, p_NV: jax.Array) -> jax.Array:
    """Draw from an explicit (possibly unnormalised, non-negative) distribution."""
    logp = jnp.where(p_NV > 0, jnp.log(jnp.maximum(p_NV, 1e-38)), -jnp.inf)
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)
