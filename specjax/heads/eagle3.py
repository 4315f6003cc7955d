"""The EAGLE-3 draft head (Li et al. 2025) as pure functions, laid out like SpecForge's
``LlamaForCausalLMEagle3`` so that vLLM and SGLang load our exports (``eagle3_io.py``).

Data flow for draft row s (rope position s): the target's residual stream at the inputs of layers
``taps`` (default ``(2, L//2, L-3)``, vLLM's ``eagle_aux_hidden_state_layer_ids``) at position s is
fused ``g_s = concat(taps) @ fc`` (3D -> D, no bias); one decoder layer reads
``x = concat(norm_in(embed(x_{s+1})), norm_hidden(g_s))`` (width 2D) for q/k/v, adds the attention
output to the residual ``g_s``, then a SwiGLU MLP; ``final_norm`` + ``lm_head`` give logits over a
reduced draft vocabulary (``draft_ids_N``: draft id -> target id) predicting ``x_{s+2}``. Chained
steps feed the layer's own pre-norm output back in place of ``g`` (row s+1 at position s+1).
The token embedding is the target's (frozen, passed in), never stored here.

params = {"fc": [D, 3D], "input_norm": [D], "hidden_norm": [D], "wqkv": [(H+2G)d, 2D], "wo": [D, Hd],
          "mlp_norm": [D], "w_gate_up": [2F, D], "w_down": [D, F], "final_norm": [D], "lm_head": [N, D]}
(weights ``[out, in]`` as everywhere in specjax, applied with ``layers.linear``)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import attention
from specjax import cache as kv
from specjax.config import ModelConfig
from specjax.layers import apply_rope, linear, operand_dtype, rms_norm, rope_tables, swiglu


def default_taps(n_layers: int) -> tuple[int, int, int]:
    """Inputs of layers 2, L//2, L-3 (= outputs of layers 1, L//2-1, L-4, as SpecForge/vLLM pick)."""
    if n_layers < 4:
        raise ValueError(f"EAGLE-3 taps (2, L//2, L-3) need a target with at least 4 layers, got {n_layers}")
    return 2, n_layers // 2, n_layers - 3


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    target: ModelConfig  # the target's shape (width, heads, rope, eps, vocab)
    draft_vocab_size: int
    taps: tuple[int, ...] = ()  # () -> default_taps(target.n_layers)
    ffn_dim: int = 0  # 0 -> target.ffn_dim

    def __post_init__(self):
        if not self.taps:
            object.__setattr__(self, "taps", default_taps(self.target.n_layers))
        object.__setattr__(self, "taps", tuple(int(t) for t in self.taps))
        if self.ffn_dim == 0:
            object.__setattr__(self, "ffn_dim", self.target.ffn_dim)
        if len(self.taps) != 3 or not all(0 <= t < self.target.n_layers for t in self.taps):
            raise ValueError(f"EAGLE-3 needs 3 taps in [0, {self.target.n_layers}), got {self.taps}")
        if not 0 < self.draft_vocab_size <= self.target.vocab_size:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must be in [1, {self.target.vocab_size}]")

    @property
    def layer(self) -> ModelConfig:
        """Shape of the single decoder layer (for its KV cache and rope tables)."""
        return self.target.replace(n_layers=1, ffn_dim=self.ffn_dim, qkv_bias=False, arch="llama")


def init_params(cfg: Eagle3Config, key: jax.Array, target_params: dict | None = None,
                draft_ids_N: jax.Array | None = None, dtype=jnp.float32, scale: float = 0.02) -> dict:
    """Random layer weights; with ``target_params`` the LM head starts as the target's rows at
    ``draft_ids_N`` (the head learns to mimic the target's final hidden state, so this helps)."""
    t, D, F = cfg.target, cfg.target.d_model, cfg.ffn_dim
    keys = iter(jax.random.split(key, 8))

    def w(shape):
        return (scale * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

    p = {"fc": w((D, 3 * D)), "input_norm": jnp.ones((D,), dtype), "hidden_norm": jnp.ones((D,), dtype),
         "wqkv": w((t.q_dim + 2 * t.kv_dim, 2 * D)), "wo": w((D, t.q_dim)), "mlp_norm": jnp.ones((D,), dtype),
         "w_gate_up": w((2 * F, D)), "w_down": w((D, F)), "final_norm": jnp.ones((D,), dtype),
         "lm_head": w((cfg.draft_vocab_size, D))}
    if target_params is not None:
        if draft_ids_N is None:
            raise ValueError("init from target_params needs draft_ids_N (draft id -> target id)")
        head_VD = target_params["embed"] if t.tie_embeddings else target_params["lm_head"]
        p["lm_head"] = jnp.take(head_VD, draft_ids_N, axis=0).astype(dtype)
        p["final_norm"] = target_params["final_norm"].astype(dtype)
    return p


def fuse(params: dict, taps: tuple[jax.Array, ...]) -> jax.Array:
    """The three tapped target hidden states [B, T, D] each -> g [B, T, D]."""
    return linear(jnp.concatenate(taps, axis=-1).astype(params["fc"].dtype), params["fc"])


def layer_input(params: dict, cfg: Eagle3Config, emb_BTD: jax.Array, h_BTD: jax.Array) -> jax.Array:
    """concat(norm(embedding), norm(hidden)): the 2D-wide input of q/k/v (embedding first)."""
    eps = cfg.target.norm_eps
    return jnp.concatenate([rms_norm(emb_BTD.astype(h_BTD.dtype), params["input_norm"], eps),
                            rms_norm(h_BTD, params["hidden_norm"], eps)], axis=-1)


def qkv(params: dict, cfg: Eagle3Config, x_BT2D: jax.Array, pos_BT: jax.Array):
    """Rotated q [B,T,H,d] and k [B,T,G,d], and v [B,T,G,d] at positions ``pos_BT``."""
    c = cfg.layer
    B, T, _ = x_BT2D.shape
    q, k, v = jnp.split(linear(x_BT2D, params["wqkv"]), [c.q_dim, c.q_dim + c.kv_dim], axis=-1)
    cos, sin = rope_tables(c, pos_BT)
    return (apply_rope(q.reshape(B, T, c.n_heads, c.head_dim), cos, sin),
            apply_rope(k.reshape(B, T, c.n_kv_heads, c.head_dim), cos, sin), v.reshape(B, T, c.n_kv_heads, c.head_dim))


def finish(params: dict, cfg: Eagle3Config, h_BTD: jax.Array, attn_BTHd: jax.Array) -> jax.Array:
    """Residual + o-proj, then the SwiGLU MLP block: the layer's pre-norm output."""
    B, T = attn_BTHd.shape[:2]
    h_BTD = h_BTD + linear(attn_BTHd.reshape(B, T, -1), params["wo"])
    x = rms_norm(h_BTD, params["mlp_norm"], cfg.target.norm_eps)
    return h_BTD + swiglu(x, params["w_gate_up"], params["w_down"])


def step(params: dict, cfg: Eagle3Config, embed_VD: jax.Array, tokens_BT: jax.Array, h_BTD: jax.Array,
         cache: kv.KVCache, pos_BT: jax.Array | None = None, tree=None) -> tuple[jax.Array, kv.KVCache]:
    """Run T draft rows appended at ``cache.lengths_B`` (row i at position lengths + i).

    ``tokens_BT`` are the tokens x_{s+1} of rows s, ``h_BTD`` the fused target features g_s (or the
    head's own previous outputs). Returns the pre-norm outputs [B, T, D] and the advanced cache.
    Draft-tree rows pass their positions ``pos_BT`` and ``tree = (visible_TW, offset)``
    (``attention.attend_new_tokens``).
    """
    c = cfg.layer
    B, T = tokens_BT.shape
    start_B = cache.lengths_B
    if pos_BT is None:
        pos_BT = start_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    cos, sin = rope_tables(c, pos_BT)
    x = layer_input(params, cfg, jnp.take(embed_VD, tokens_BT, axis=0), h_BTD)
    qkv_BTNd = linear(x, params["wqkv"]).reshape(B, T, c.n_heads + 2 * c.n_kv_heads, c.head_dim)
    # RoPE, the cache writes and attention: one kernel on Hopper for T <= 32 (the target's layers use it too)
    o_BTHd, k_BSGd, v_BSGd = attention.attend_new_tokens(qkv_BTNd, cache.k[0], cache.v[0], cos, sin, start_B,
                                                         c.n_heads, tree=tree,
                                                         out_dtype=operand_dtype(params["wo"]))
    return finish(params, cfg, h_BTD, o_BTHd), kv.KVCache(k=(k_BSGd,), v=(v_BSGd,), lengths_B=start_B + T)


def logits(params: dict, cfg: Eagle3Config, h_BTD: jax.Array) -> jax.Array:
    """Pre-norm head output -> float32 logits over the draft vocabulary [B, T, N]."""
    x = rms_norm(h_BTD, params["final_norm"], cfg.target.norm_eps)
    return jnp.einsum("btd,nd->btn", x, params["lm_head"], preferred_element_type=jnp.float32)


def to_target_vocab(logits_XN: jax.Array, draft_ids_N: jax.Array, vocab_size: int) -> jax.Array:
    """Draft-vocabulary logits -> target-vocabulary logits (-inf outside the draft vocabulary)."""
    out = jnp.full(logits_XN.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
    return out.at[..., draft_ids_N].set(logits_XN.astype(jnp.float32))


def init_cache(cfg: Eagle3Config, batch: int, capacity: int, dtype=jnp.float32) -> kv.KVCache:
    return kv.init_cache(cfg.layer, batch, capacity, dtype)
