"""The KV cache: a pytree that functions return, never mutate.

Layout per layer: ``k_BSGd`` / ``v_BSGd``. Slot s holds the token at position s, so the causal
mask alone (key slot <= query position) decides what a query sees; slots at or past ``lengths_B``
are stale and are overwritten by the next write. Rolling back a rejected draft is therefore just
moving ``lengths_B`` backwards.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: tuple[jax.Array, ...]  # L x [B, S, G, d]
    v: tuple[jax.Array, ...]  # L x [B, S, G, d]
    lengths_B: jax.Array  # int32 [B]: valid slots per sequence (= next write position)

    @property
    def batch(self) -> int:
        return self.lengths_B.shape[0]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    def replace(self, **kw) -> "KVCache":
        return dataclasses.replace(self, **kw)


def init_cache(cfg: ModelConfig, batch: int, capacity: int, dtype=jnp.float32, n_layers: int | None = None) -> KVCache:
    """An empty cache of ``capacity`` slots per sequence (``n_layers`` defaults to the model's).

    ``dtype`` is normally the weights' dtype; with ``cfg.compute_dtype == "float32"`` the cache holds
    float32 instead, so K/V written by a verify forward and by a decode step are not rounded to bf16
    (rounding that would turn their last-bit float32 differences into bf16-ulp ones)."""
    if cfg.compute_dtype == "float32":
        dtype = jnp.float32
    if capacity <= 0 or batch <= 0:
        raise ValueError(f"cache needs batch > 0 and capacity > 0, got batch={batch}, capacity={capacity}")
    L = cfg.n_layers if n_layers is None else n_layers
    shape = (batch, capacity, cfg.n_kv_heads, cfg.head_dim)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(L))
    return KVCache(k=zeros, v=tuple(jnp.zeros(shape, dtype) for _ in range(L)),
                   lengths_B=jnp.zeros((batch,), jnp.int32))


def write(cache_BSGd: jax.Array, new_BTGd: jax.Array, start_B: jax.Array) -> jax.Array:
    """Write T new rows per sequence at that sequence's own start slot (ragged batch)."""
    new_BTGd = new_BTGd.astype(cache_BSGd.dtype)
    if cache_BSGd.shape[0] == 1:  # one in-place dynamic-update-slice instead of a scatter
        return jax.lax.dynamic_update_slice(cache_BSGd, new_BTGd, (0, start_B[0], 0, 0))

    def one(c_SGd, x_TGd, s):
        return jax.lax.dynamic_update_slice(c_SGd, x_TGd, (s, 0, 0))
    return jax.vmap(one)(cache_BSGd, new_BTGd, start_B)


def rollback(cache: KVCache, lengths_B: jax.Array) -> KVCache:
    """Keep only the first ``lengths_B`` slots of each sequence (later slots become stale)."""
    return cache.replace(lengths_B=jnp.minimum(cache.lengths_B, lengths_B).astype(jnp.int32))


def set_lengths(cache: KVCache, lengths_B: jax.Array) -> KVCache:
    return cache.replace(lengths_B=lengths_B.astype(jnp.int32))


def gather_rows(cache: KVCache, start_B: jax.Array, rows_BR: jax.Array) -> KVCache:
    """Every layer's slots ``start_B + r`` for ``r`` in ``rows_BR[b]`` moved to ``start_B + 0..R-1`` (the
    accepted path of a draft tree into position order; other slots keep their rows). Lengths unchanged.
    On Hopper one kernel moves the rows of all layers (``pallas_kernels.move_rows``; as XLA ops it is a
    gather and an update per array, ~120 launches for SmolLM2); the code below is its definition."""
    from specjax.attention import _dispatch  # the kernel dispatch lives with attention (which imports this module)
    dispatch = _dispatch()
    moved = None if dispatch is None else dispatch.move_rows(cache.k + cache.v, start_B, rows_BR)
    if moved is not None:
        n = len(cache.k)
        return cache.replace(k=moved[:n], v=moved[n:])

    def one(c_SGd, r_R, s):
        return jax.lax.dynamic_update_slice(c_SGd, jnp.take(c_SGd, s + r_R, axis=0, mode="clip"), (s, 0, 0))

    def layer(c_BSGd):
        if c_BSGd.shape[0] == 1:  # one in-place dynamic-update-slice, as ``write`` (vmap would make a scatter)
            rows_1RGd = jnp.take(c_BSGd, start_B[0] + rows_BR[0].astype(jnp.int32), axis=1, mode="clip")
            return jax.lax.dynamic_update_slice(c_BSGd, rows_1RGd, (0, start_B[0], 0, 0))
        return jax.vmap(one)(c_BSGd, rows_BR.astype(jnp.int32), start_B)
    return cache.replace(k=tuple(map(layer, cache.k)), v=tuple(map(layer, cache.v)))
