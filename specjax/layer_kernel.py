"""The default decode path for one token of one sequence (B * T = 1) on Hopper: every decoder layer
in one launch (``pallas_kernels/decode_layer.py``), instead of XLA's ~9 kernels per layer.

``model.forward`` asks ``applies`` once per forward and then runs each layer through ``layer``,
threading the kernel's barrier flags from layer to layer. Elsewhere (CPU, B * T > 1, prefill,
``compute_dtype="float32"``, models too large for the kernel's per-program tiles) the XLA layer of
``model.py`` runs, which is also the readable definition of what the kernel computes.

``SPECJAX_LAYER_KERNEL=0`` turns it off (A/B timing); read when the model is traced.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig


def applies(lp: dict, cfg: ModelConfig, x_BTD, k_BSGd, v_BSGd) -> bool:
    """Static: the layer kernel runs this cached forward (all layers share shapes, so layer 0 decides)."""
    env = os.environ.get("SPECJAX_LAYER_KERNEL", "1")
    if env not in ("0", "1"):
        raise ValueError(f"SPECJAX_LAYER_KERNEL={env!r}: expected 1 (on, default on Hopper) or 0 (off)")
    if env == "0" or cfg.compute_dtype != "param" or not _hopper():
        return False
    try:
        from pallas_kernels import decode_layer
    except ImportError:
        return False
    return (k_BSGd.dtype == lp["wqkv"].dtype
            and decode_layer.unsupported(lp, x_BTD, k_BSGd, v_BSGd, cfg.n_heads, cfg.norm_eps) is None)


def _hopper() -> bool:
    dev = jax.devices()[0]
    return dev.platform == "gpu" and getattr(dev, "compute_capability", "") in ("9.0", "9.0a")


def counters():
    """The kernel's barrier flags for a chain of layers (int32 zeros; each layer returns the next one's)."""
    from pallas_kernels import decode_layer
    return jnp.zeros((decode_layer.flags_size(),), jnp.int32)


def layer(lp: dict, cfg: ModelConfig, x_BTD, cos, sin, start_B, k_BSGd, v_BSGd, flags_P):
    """One decoder layer by the kernel: ``(x_BTD, k, v, flags)``."""
    from pallas_kernels import decode_layer
    D, d = x_BTD.shape[-1], cfg.head_dim
    x_D, k_BSGd, v_BSGd, flags_P = decode_layer.decode_layer(
        lp, x_BTD.reshape(D), cos.reshape(d), sin.reshape(d), start_B, k_BSGd, v_BSGd, flags_P,
        n_heads=cfg.n_heads, eps=cfg.norm_eps)
    return x_D.reshape(1, 1, D), k_BSGd, v_BSGd, flags_P
