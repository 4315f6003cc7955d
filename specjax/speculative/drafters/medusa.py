"""Medusa drafter (chain): head k's top token at the target's last hidden state is draft d_{k+1}.

The state is the target's final-normed hidden state at position L-1 (the one that produced
``last``); head k predicts x_{L+1+k}, so K <= num_heads. Drafts are drawn (greedy: argmax) from
each head's own distribution q_k, which makes rejection sampling exact: the output distribution is
the target's. (Medusa's "typical acceptance" is lossy and not offered here.) With a ``tree``, a node
of depth d and rank r is head (d-1)'s r-th most likely token (Medusa's static "choices").

``dp`` = the Medusa head params (``specjax.heads.medusa``); the shared LM head is the target's.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax.heads import medusa
from specjax.speculative.drafters.base import Context, Drafter, Prefill, Proposal, Verified, draw, row_at
from specjax.speculative.tree import Tree


@dataclasses.dataclass(frozen=True)
class Medusa(Drafter):
    name: ClassVar[str] = "medusa"
    cfg: medusa.MedusaConfig
    tree: Tree | None = None

    @property
    def taps(self) -> tuple[int, ...]:
        return self.cfg.taps

    @property
    def max_draft(self) -> int:
        return self.cfg.num_heads

    def validate(self, cfg, dp, num_draft: int) -> None:
        super().validate(cfg, dp, num_draft)
        t = self.cfg.target
        if (cfg.vocab_size, cfg.d_model, cfg.n_layers) != (t.vocab_size, t.d_model, t.n_layers):
            want, got = (t.vocab_size, t.d_model, t.n_layers), (cfg.vocab_size, cfg.d_model, cfg.n_layers)
            raise ValueError(f"the Medusa heads were built for a target with vocab/width/layers {want}, got {got}")
        if not isinstance(dp, dict) or "w_KNDD" not in dp or dp["w_KNDD"].shape[0] != self.cfg.num_heads:
            raise ValueError(f"Medusa draft params must be the heads' params with {self.cfg.num_heads} heads")

    def init(self, tp, dp, pre: Prefill, cfg):
        return row_at(pre.taps[0], pre.lengths_B - 1)

    def propose(self, tp, dp, h_BD, ctx: Context, target_cache, cfg):
        if self.tree is not None:
            return Proposal(self._tree_nodes(tp, dp, h_BD), None), h_BD, target_cache
        K = ctx.num_draft
        heads = {name: x[:K] for name, x in dp.items()}
        logits_KBV = medusa.logits(heads, self.cfg, h_BD, tp)
        if ctx.greedy:
            return Proposal(jnp.argmax(logits_KBV, axis=-1).T.astype(jnp.int32), None), h_BD, target_cache
        toks, qs = zip(*(draw(k, logits_KBV[i], ctx.sp) for i, k in enumerate(jax.random.split(ctx.key, K))))
        return Proposal(jnp.stack(toks, axis=1), jnp.stack(qs, axis=1)), h_BD, target_cache

    def _tree_nodes(self, tp, dp, h_BD):
        tree = self.tree
        logits_DBV = medusa.logits({name: x[:tree.depth] for name, x in dp.items()}, self.cfg, h_BD, tp)
        cols = []
        for d in range(1, tree.depth + 1):
            top_BR = jax.lax.top_k(logits_DBV[d - 1], tree.top_k(d))[1]
            lo, hi = tree.level(d)
            cols.append(top_BR[:, tree.ranks[lo:hi]])
        return jnp.concatenate(cols, axis=1).astype(jnp.int32)

    def update(self, tp, dp, h_BD, ver: Verified):
        n_B = ver.num_new_B
        return jnp.where((n_B > 0)[:, None], row_at(ver.taps[0], jnp.maximum(n_B - 1, 0)), h_BD)
