"""Self-speculation (LayerSkip-style early exit): the target's first N layers + an exit head.

The exit head is the target's own final norm and LM head by default (zero training: expect it to be
slower than plain decoding), or a trained one passed as ``dp``: a dict with any of
``final_norm`` [D], ``lm_head`` [V, D] (replacing the target's) and ``adapter`` [D, D] (a residual
linear map applied to the layer-N hidden state before the norm; zero-init = no-op).

The first N layers' K/V of every accepted token equal the target's (same weights, same inputs), so
the drafter works directly in the target's cache: it writes its K/V at L..L+K-1 in place, and the
verify forward then overwrites L..L+K with the full model's. No second cache, no rollback, no copy.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax import cache as kv
from specjax import model
from specjax.config import ModelConfig
from specjax.layers import linear, rms_norm
from specjax.speculative.drafters.base import Context, Drafter, Proposal, draw

EXIT_HEAD_KEYS = ("final_norm", "lm_head", "adapter")


@dataclasses.dataclass(frozen=True)
class LayerSkip(Drafter):
    name: ClassVar[str] = "layerskip"
    num_layers: int  # exit after this many target layers

    def validate(self, cfg: ModelConfig, dp, num_draft: int) -> None:
        super().validate(cfg, dp, num_draft)
        if not 1 <= self.num_layers <= cfg.n_layers:
            raise ValueError(f"layerskip exit layer must be in [1, {cfg.n_layers}] (the target's depth), "
                             f"got {self.num_layers}")
        if dp is None:
            return
        D, V = cfg.d_model, cfg.vocab_size
        expected = {"final_norm": (D,), "lm_head": (V, D), "adapter": (D, D)}
        if not isinstance(dp, dict) or not dp or set(dp) - set(EXIT_HEAD_KEYS):
            raise ValueError(f"a layerskip exit head is a dict with keys among {EXIT_HEAD_KEYS}, got {dp!r:.200}")
        for k, v in dp.items():
            if tuple(v.shape) != expected[k]:
                raise ValueError(f"exit head {k!r} has shape {tuple(v.shape)}, expected {expected[k]}")
        if self.num_layers == cfg.n_layers:
            raise ValueError("an exit head after all layers is not an early exit; use num_layers < n_layers")

    def _logits(self, tp, dp, cfg: ModelConfig, tok_B, cache: kv.KVCache):
        N = self.num_layers
        if dp is None:
            logits_B1V, _, cache = model.forward(tp, cfg, tok_B[:, None], cache, num_layers=N)
            return logits_B1V[:, 0], cache
        _, (h_B1D,), cache = model.forward(tp, cfg, tok_B[:, None], cache, num_layers=N, taps=(N,),
                                           compute_logits=False)
        if "adapter" in dp:
            h_B1D = h_B1D + linear(h_B1D, dp["adapter"])
        h_B1D = rms_norm(h_B1D, dp.get("final_norm", tp["final_norm"]), cfg.norm_eps)
        if "lm_head" in dp:
            logits_B1V = model.lm_head({"lm_head": dp["lm_head"]}, cfg.replace(tie_embeddings=False), h_B1D)
        else:
            logits_B1V = model.lm_head(tp, cfg, h_B1D)
        return logits_B1V[:, 0], cache

    def propose(self, tp, dp, state, ctx: Context, target_cache: kv.KVCache, cfg: ModelConfig):
        N = self.num_layers
        shallow = kv.KVCache(k=target_cache.k[:N], v=target_cache.v[:N], lengths_B=ctx.lengths_B)

        def step(carry, key):
            cache, tok_B = carry
            logits_BV, cache = self._logits(tp, dp, cfg, tok_B, cache)
            nxt_B, q_BV = draw(key, logits_BV, ctx.sp)
            return (cache, nxt_B), (nxt_B, q_BV)

        (shallow, _), (tokens_KB, q_KBV) = jax.lax.scan(step, (shallow, ctx.last_B),
                                                        jax.random.split(ctx.key, ctx.num_draft))
        target_cache = kv.KVCache(k=shallow.k + target_cache.k[N:], v=shallow.v + target_cache.v[N:],
                                  lengths_B=target_cache.lengths_B)
        q_BKV = None if q_KBV is None else jnp.transpose(q_KBV, (1, 0, 2))
        return Proposal(tokens_KB.T, q_BKV), state, target_cache
