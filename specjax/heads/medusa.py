"""Medusa-1 heads (Cai et al. 2024) on a frozen target, as pure functions.

Head k (k = 0..K-1) reads the target's final-normed hidden state at position t (the one whose LM
head predicts x_{t+1}) and predicts x_{t+2+k}: ``num_layers`` residual blocks
``x + silu(x @ w + b)`` (initialised to the identity, as in the Medusa repository), then an LM head:
the target's own (``own_lm_head=False``, nothing extra to store) or one per head (initialised from
the target's, the Medusa repository's layout).

params = {"w_KNDD": [K, n, D, D], "b_KND": [K, n, D], ("lm_head_KVD": [K, V, D] if own_lm_head)}
(weights ``[out, in]`` as everywhere in specjax)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
    target: ModelConfig
    num_heads: int = 4
    num_layers: int = 1
    own_lm_head: bool = False

    def __post_init__(self):
        if self.num_heads < 1 or self.num_layers < 1:
            raise ValueError(f"Medusa needs num_heads >= 1 and num_layers >= 1, got {self.num_heads}, "
                             f"{self.num_layers}")

    @property
    def taps(self) -> tuple[int]:
        return (self.target.n_layers,)  # the final-normed hidden state


def init_params(cfg: MedusaConfig, target_params: dict | None = None, dtype=jnp.float32) -> dict:
    """Identity residual blocks (zero weights and biases); own LM heads copy the target's."""
    K, n, D = cfg.num_heads, cfg.num_layers, cfg.target.d_model
    p = {"w_KNDD": jnp.zeros((K, n, D, D), dtype), "b_KND": jnp.zeros((K, n, D), dtype)}
    if cfg.own_lm_head:
        if target_params is None:
            raise ValueError("own_lm_head=True initialises each head from the target's LM head: pass target_params")
        head_VD = target_params["embed"] if cfg.target.tie_embeddings else target_params["lm_head"]
        p["lm_head_KVD"] = jnp.broadcast_to(head_VD.astype(dtype), (K,) + head_VD.shape)
    return p


def hidden(params: dict, h_XD: jax.Array) -> jax.Array:
    """Residual blocks of every head: [..., D] -> [K, ..., D]."""
    K, n = params["w_KNDD"].shape[:2]
    x = jnp.broadcast_to(h_XD.astype(params["w_KNDD"].dtype), (K,) + h_XD.shape)
    for i in range(n):
        w_KDD, b_KD = params["w_KNDD"][:, i], params["b_KND"][:, i]
        y = jnp.einsum("k...d,ked->k...e", x, w_KDD) + b_KD.reshape((K,) + (1,) * (x.ndim - 2) + (-1,))
        x = x + jax.nn.silu(y)
    return x


def logits(params: dict, cfg: MedusaConfig, h_XD: jax.Array, target_params: dict) -> jax.Array:
    """float32 logits [K, ..., V] of every head from final-normed target hidden states [..., D]."""
    x = hidden(params, h_XD)
    if "lm_head_KVD" in params:
        return jnp.einsum("k...d,kvd->k...v", x, params["lm_head_KVD"], preferred_element_type=jnp.float32)
    head_VD = target_params["embed"] if cfg.target.tie_embeddings else target_params["lm_head"]
    return jnp.einsum("k...d,vd->k...v", x, head_VD.astype(x.dtype), preferred_element_type=jnp.float32)

