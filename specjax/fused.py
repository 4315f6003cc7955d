"""An opt-in decode / verify path: a decoder layer as four fused Pallas matmul kernels plus attention.

OFF by default: on an H200 it is slower than XLA's own kernels (benchmarks/NOTES.md item 10: SmolLM2
shape B=1 0.836 vs 0.786 ms/token, and 2-5x slower per kernel at 8 rows, i.e. in a K=7 verify).
What it offers is exactness: turned on with ``SPECJAX_FUSED=1``, a verify forward gives bitwise the
logits of decode steps over the same tokens (below), so bf16 greedy speculative decoding repeats
greedy AR decoding token for token (``compute_dtype="float32"`` is the other way, the one measured on
the MT-bench and HumanEval sets: README).

``model.forward`` takes this path when ``mode`` says so: ``SPECJAX_FUSED=1`` and a GPU backend,
``compute_dtype="param"``, a KV cache, and at most ``skinny_linear.MAX_ROWS`` rows (B * T). Prefill
and training keep the XLA path of ``model.py``, which is also the readable definition of what this
computes (tests/test_fused.py compares the two).

Per layer: ``norm_qkv_rope`` (RMSNorm, q/k/v, bias, RoPE, K/V written into the cache) ->
``attention.attend`` (the decode attention kernel on Hopper) -> ``linear_residual`` (o projection +
residual) -> ``norm_swiglu`` (RMSNorm, gate/up, SiLU) -> ``linear_residual`` (down + residual); the
LM head is ``norm_linear`` (final norm + head). 8 launches per layer instead of XLA's ~16 (the
measured lesson: in the decode loop each one reads its weights from HBM with too few programs in
flight, and fewer launches did not make up for it).

Every kernel computes each row independently of the row count, as the decode attention kernel does,
so a verify forward gives bitwise the logits of decode steps over the same tokens
(``pallas_kernels/skinny_linear.py``): greedy speculative decoding then reproduces greedy AR decoding
token for token in bf16.

``SPECJAX_FUSED=1`` turns the path on (GPU backends), ``0`` (default) off; ``interpret`` runs it in the
Pallas interpreter on any backend (slow; for tests and debugging). Read when the model is traced.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from specjax import attention
from specjax.config import ModelConfig


def mode(cfg: ModelConfig, rows: int, weight_dtype) -> str | None:
    """"kernel", "interpret" or None (the XLA path) for a cached forward over ``rows`` = B * T rows."""
    try:
        from pallas_kernels import skinny_linear as sl
    except ImportError:
        return None
    env = os.environ.get("SPECJAX_FUSED", "0")
    if env not in ("0", "1", "interpret"):
        raise ValueError(f"SPECJAX_FUSED={env!r}: expected 0 (off, default), 1 (on, GPU) or interpret")
    bn = sl.TuningConfig().block_n
    fits = (cfg.compute_dtype == "param" and 1 <= rows <= sl.MAX_ROWS
            and jnp.dtype(weight_dtype) in (jnp.bfloat16, jnp.float16, jnp.float32)
            and cfg.head_dim % (2 * bn) == 0
            and cfg.d_model % bn == 0 and cfg.ffn_dim % bn == 0 and cfg.vocab_size % bn == 0)
    if env == "0" or not fits:
        return None
    if env == "interpret":
        return "interpret"
    return "kernel" if env == "1" and _gpu_backend() else None


def _gpu_backend() -> bool:
    return jax.default_backend() == "gpu"


def decoder_layer(lp, cfg: ModelConfig, x_BTD, cos, sin, q_pos_BT, k_BSGd, v_BSGd, start_B=None, *,
                  interpret: bool = False):
    """``model.decoder_layer`` by the fused kernels (same signature; K/V slots come from ``q_pos_BT``)."""
    from pallas_kernels import skinny_linear as sl
    B, T, D = x_BTD.shape
    M, H, d, eps = B * T, cfg.n_heads, cfg.head_dim, cfg.norm_eps
    x_MD = x_BTD.reshape(M, D)
    q_MQ, k_BSGd, v_BSGd = sl.norm_qkv_rope(
        x_MD, lp["attn_norm"], lp["wqkv"], lp.get("bqkv"), cos.reshape(M, d), sin.reshape(M, d),
        q_pos_BT.reshape(M), k_BSGd, v_BSGd, n_heads=H, eps=eps, interpret=interpret)
    o_BTHd = attention.attend(q_MQ.reshape(B, T, H, d), k_BSGd, v_BSGd, q_pos_BT, cfg.compute_dtype)
    x_MD = sl.linear_residual(o_BTHd.reshape(M, H * d), lp["wo"], x_MD, interpret=interpret)
    h_MF = sl.norm_swiglu(x_MD, lp["mlp_norm"], lp["w_gate_up"], eps=eps, interpret=interpret)
    x_MD = sl.linear_residual(h_MF, lp["w_down"], x_MD, interpret=interpret)
    return x_MD.reshape(B, T, D), k_BSGd, v_BSGd


def lm_head(params: dict, cfg: ModelConfig, x_BND, *, interpret: bool = False):
    """Final norm + LM head of the un-normed hidden states [B, N, D] -> float32 logits [B, N, V]."""
    from pallas_kernels import skinny_linear as sl
    B, N, D = x_BND.shape
    w_VD = params["embed"] if cfg.tie_embeddings else params["lm_head"]
    logits = sl.norm_linear(x_BND.reshape(B * N, D), params["final_norm"], w_VD, eps=cfg.norm_eps,
                            interpret=interpret)
    return logits.reshape(B, N, -1)
