"""The Llama-family decoder as pure functions over a params pytree.

params = {
  "embed": [V, D],
  "layers": [ {"attn_norm": [D], "wqkv": [(H+2G)d, D], ("bqkv": [(H+2G)d] for qwen2),
               "wo": [D, Hd], "mlp_norm": [D], "w_gate_up": [2F, D], "w_down": [D, F]} ] * L,
  "final_norm": [D],
  "lm_head": [V, D]            # absent when cfg.tie_embeddings
}
Weights are stored ``[out, in]`` as in HF checkpoints (``layers.linear``); q/k/v and gate/up are
stored fused (one matmul each); loaders split/join names. Weights and the KV cache may be bf16; the
residual stream and every matmul's accumulation and output are float32 (see ``layers.linear``).
``cfg.compute_dtype`` sets the matmul operand dtype of every matmul here (q/k/v, attention, o, MLP,
LM head): "param" (the weight dtype) or "float32" (weights upcast inside the product).
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import attention, fused
from specjax import cache as kv
from specjax.config import ModelConfig
from specjax.layers import fold_norm, linear, linear_sumsq, norm_swiglu, operand_dtype, rms_norm, rope_tables


def init_params(cfg: ModelConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02) -> dict:
    """Random parameters (tests, benchmarks of model shapes)."""
    D, F, V = cfg.d_model, cfg.ffn_dim, cfg.vocab_size
    qkv = cfg.q_dim + 2 * cfg.kv_dim
    keys = iter(jax.random.split(key, 4 + 5 * cfg.n_layers))

    def w(shape):
        return (scale * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

    layers = []
    for _ in range(cfg.n_layers):
        lp = {"attn_norm": jnp.ones((D,), dtype), "wqkv": w((qkv, D)), "wo": w((D, cfg.q_dim)),
              "mlp_norm": jnp.ones((D,), dtype), "w_gate_up": w((2 * F, D)), "w_down": w((D, F))}
        if cfg.qkv_bias:
            lp["bqkv"] = w((qkv,))
        layers.append(lp)
    params = {"embed": w((V, D)), "layers": layers, "final_norm": jnp.ones((D,), dtype)}
    if not cfg.tie_embeddings:
        params["lm_head"] = w((V, D))
    return params


def embed(params: dict, tokens_BT: jax.Array) -> jax.Array:
    """Token embeddings as float32 (the residual stream is float32 whatever the weights' dtype)."""
    return jnp.take(params["embed"], tokens_BT, axis=0).astype(jnp.float32)


def lm_head(params: dict, cfg: ModelConfig, h_BTD: jax.Array) -> jax.Array:
    """Final-normed hidden states -> float32 logits (operands per ``cfg.compute_dtype``)."""
    w_VD = params["embed"] if cfg.tie_embeddings else params["lm_head"]
    return linear(h_BTD, w_VD, cfg.compute_dtype)


def attention_block(lp: dict, cfg: ModelConfig, x_BTD, cos, sin, k_BSGd, v_BSGd, start_B, tree=None):
    """One attention sub-layer on the residual stream ``x_BTD`` (its RMSNorm included); writes this
    step's K/V into the cache at ``start_B``.

    At one row of a model up to ``layers.FOLD_MAX_IN`` wide without q/k/v bias (``layers.fold_norm``: a
    decode step at B=1) the norm is folded into the q|k|v reduction (``layers.linear_sumsq``: q|k|v of
    x * w plus one extra head holding sum(x**2)) and the attention scales each token's q|k|v by 1/rms
    (``attention.attend_new_tokens(norm=...)``): no norm kernel. ``tree``: see ``forward(tree_TT=...)``."""
    B, T, _ = x_BTD.shape
    H, G, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    o_dtype = operand_dtype(lp["wo"], cfg.compute_dtype)  # o comes out rounded as the o projection reads it
    if tree is None and fold_norm(x_BTD, lp["wqkv"], cfg.compute_dtype) and "bqkv" not in lp:
        qkvs = linear_sumsq(lp["attn_norm"] * x_BTD, lp["wqkv"], x_BTD, copies=d)
        o_BTHd, k_BSGd, v_BSGd = attention.attend_new_tokens(qkvs.reshape(B, T, H + 2 * G + 1, d), k_BSGd,
                                                             v_BSGd, cos, sin, start_B, H, cfg.compute_dtype,
                                                             norm=(cfg.d_model, cfg.norm_eps), out_dtype=o_dtype)
    else:
        qkv = linear(rms_norm(x_BTD, lp["attn_norm"], cfg.norm_eps), lp["wqkv"], cfg.compute_dtype)
        if "bqkv" in lp:
            qkv = qkv + lp["bqkv"]
        o_BTHd, k_BSGd, v_BSGd = attention.attend_new_tokens(qkv.reshape(B, T, H + 2 * G, d), k_BSGd, v_BSGd,
                                                             cos, sin, start_B, H, cfg.compute_dtype,
                                                             tree=tree, out_dtype=o_dtype)
    return linear(o_BTHd.reshape(B, T, H * d), lp["wo"], cfg.compute_dtype), k_BSGd, v_BSGd


def decoder_layer(lp, cfg, x_BTD, cos, sin, q_pos_BT, k_BSGd, v_BSGd, start_B, tree=None):
    """One decoder layer. ``q_pos_BT`` (= start_B + t) is unused here; the signature is the one
    ``fused.decoder_layer`` shares, which takes the K/V slots from it."""
    a, k_BSGd, v_BSGd = attention_block(lp, cfg, x_BTD, cos, sin, k_BSGd, v_BSGd, start_B, tree)
    x_BTD = x_BTD + a
    x_BTD = x_BTD + norm_swiglu(x_BTD, lp["mlp_norm"], cfg.norm_eps, lp["w_gate_up"], lp["w_down"],
                                cfg.compute_dtype)
    return x_BTD, k_BSGd, v_BSGd


def forward(params: dict, cfg: ModelConfig, tokens_BT: jax.Array, cache: kv.KVCache | None = None, *,
            taps: Sequence[int] = (), logits_index_BN: jax.Array | None = None,
            num_layers: int | None = None, compute_logits: bool = True, tree_TT=None, tree_rows=None):
    """Run the decoder on T new tokens per sequence, appended at ``cache.lengths_B``.

    Returns ``(logits, taps, cache)``:
      logits  float32 [B, T, V] (or [B, N, V] at ``logits_index_BN``; None if not compute_logits);
      taps    tuple of [B, T, D] hidden states, one per requested index: i < L is the input of
              layer i (0 = embeddings), i == L the final-normed hidden state the LM head sees;
      cache   with the new K/V written and lengths advanced by T (callers roll back as needed).
    ``cache=None`` runs a plain causal forward over the T tokens (training / scoring).
    ``num_layers`` runs only the first N layers (self-speculative early exit), then norm + head.
    With ``SPECJAX_FUSED=1`` on a GPU, cached forwards of B * T <= 16 rows run through ``fused.py``.
    ``tree_TT`` (bool [T, T], ``Tree.ancestors``): the T tokens are a draft tree's nodes, not a run. Row t
    sits at position ``start + depth(t)`` (its count of ancestors) but is written to slot ``start + t``,
    and sees the context and its ancestors only (``attention.attend_new_tokens(tree=...)``); callers
    move the accepted path's K/V into place afterwards (``cache.gather_rows``).
    ``tree_rows = (visible_TW, offset, depth)``: the T tokens are the nodes of one depth of a draft tree that a
    drafter drafts level by level (``DraftModel(tree=...)``). The tree's rows are written from slot
    ``base = start - offset`` on (this level's first at ``start``); row t sees the context (slots before
    ``base``) and slot ``base + w`` where ``visible_TW[t, w]`` (its ancestors and itself), and sits at
    position ``base + depth - 1``.
    """
    B, T = tokens_BT.shape
    L = cfg.n_layers if num_layers is None else num_layers
    if not 0 < L <= cfg.n_layers:
        raise ValueError(f"num_layers={num_layers} must be in [1, {cfg.n_layers}]")
    for i in taps:
        if not 0 <= i <= cfg.n_layers:
            raise ValueError(f"tap {i} out of range [0, {cfg.n_layers}]")
    cached = cache is not None
    if cache is None:
        cache = kv.init_cache(cfg, B, T, params["embed"].dtype, n_layers=L)
    start_B = cache.lengths_B
    q_pos_BT = start_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    tree = None
    if tree_TT is not None:
        if not cached or tuple(tree_TT.shape) != (T, T):
            raise ValueError(f"tree_TT must be a [T, T] = [{T}, {T}] ancestor mask of a cached forward, "
                             f"got shape {tuple(tree_TT.shape)}{'' if cached else ' without a cache'}")
        tree_TT = np.asarray(tree_TT, bool)
        q_pos_BT = start_B[:, None] + jnp.asarray(tree_TT.sum(axis=1).astype(np.int32) - 1)[None, :]
        tree = (tree_TT, 0)
    if tree_rows is not None:
        visible_TW, offset, depth = tree_rows
        shape = np.shape(visible_TW)
        if tree is not None or not cached or len(shape) != 2 or shape[0] != T or not 0 <= offset < shape[1]:
            raise ValueError(f"tree_rows needs a cached forward without tree_TT, a [T, W] = [{T}, W] visibility "
                             f"mask and 0 <= offset < W; got shape {shape}, offset {offset}")
        q_pos_BT = jnp.broadcast_to((start_B - offset + depth - 1)[:, None], (B, T)).astype(jnp.int32)
        tree = (np.asarray(visible_TW, bool), int(offset))
    cos, sin = rope_tables(cfg, q_pos_BT)
    x_BTD = embed(params, tokens_BT)
    path = fused.mode(cfg, B * T, params["embed"].dtype) if cached and tree is None else None  # decode / verify
    layer = (functools.partial(decoder_layer, tree=tree) if path is None
             else functools.partial(fused.decoder_layer, interpret=path == "interpret"))
    tapped = {}
    new_k, new_v = list(cache.k), list(cache.v)
    for i in range(L):
        if i in taps:
            tapped[i] = x_BTD
        x_BTD, new_k[i], new_v[i] = layer(params["layers"][i], cfg, x_BTD, cos, sin, q_pos_BT,
                                          cache.k[i], cache.v[i], start_B)
    if L < cfg.n_layers and L in taps:  # early exit: the input of layer L (= output of the last layer run)
        tapped[L] = x_BTD
    if L == cfg.n_layers and cfg.n_layers in taps:
        tapped[cfg.n_layers] = rms_norm(x_BTD, params["final_norm"], cfg.norm_eps)
    logits = None
    if compute_logits:
        if logits_index_BN is not None:
            x_BTD = jnp.take_along_axis(x_BTD, logits_index_BN[:, :, None], axis=1)
        rows = x_BTD.shape[0] * x_BTD.shape[1]
        if path is not None and fused.mode(cfg, rows, params["embed"].dtype) == path:
            logits = fused.lm_head(params, cfg, x_BTD, interpret=path == "interpret")
        else:
            logits = lm_head(params, cfg, rms_norm(x_BTD, params["final_norm"], cfg.norm_eps))
    new_cache = kv.KVCache(k=tuple(new_k), v=tuple(new_v), lengths_B=start_B + T)
    return logits, tuple(tapped[i] for i in taps), new_cache
