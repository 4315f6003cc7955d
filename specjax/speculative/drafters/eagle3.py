"""EAGLE-3 drafter: a chain of K tokens from the one-layer head over the target's fused features.

Draft row s (position s) reads the target's features g_s and the token x_{s+1}. The head's KV cache
mirrors positions: after every verification the head re-runs rows L..L'-1 with the target's true
features (its chained rows there are stale and overwritten), so at each cycle it holds rows
0..L-1 and the pre-norm output ``h`` of row L-1, from which d_1 follows; d_k (k >= 2) comes from
chained rows L..L+k-2 that feed the head's own output back. Cost per cycle: one (K+1)-row step in
``update`` + (K-1) one-row steps in ``propose``.

With a ``tree`` the head drafts level by level: the children of a node are the head's top-ranked tokens
at that node's row, and the nodes of depth d run as one step of as many rows (depth - 1 steps in all), at
position L + d - 1, written to scratch slots L + i - 1 (node i), each seeing the context and its own
ancestors (``attention.attend_new_tokens(tree=...)``). Like the chain's, these rows are stale after the cycle.

``dp = {"params": head params, "draft_ids": int32 [N]}``; the token embedding is the target's.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax import cache as kv
from specjax.heads import eagle3
from specjax.speculative.drafters.base import (Context, Drafter, Prefill, Proposal, Verified, draw, row_at,
                                               tree_children)
from specjax.speculative.tree import Tree


def shape_of(cfg) -> tuple:
    return cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.rope_theta


@dataclasses.dataclass(frozen=True)
class Eagle3(Drafter):
    name: ClassVar[str] = "eagle3"
    cfg: eagle3.Eagle3Config
    tree: Tree | None = None

    @property
    def taps(self) -> tuple[int, ...]:
        return self.cfg.taps

    def validate(self, cfg, dp, num_draft: int) -> None:
        super().validate(cfg, dp, num_draft)
        if shape_of(cfg) != shape_of(self.cfg.target):
            raise ValueError(f"the EAGLE-3 head was built for a target of shape {shape_of(self.cfg.target)}, "
                             f"got {shape_of(cfg)} (vocab, width, layers, heads, kv heads, rope theta)")
        if not isinstance(dp, dict) or set(dp) != {"params", "draft_ids"}:
            raise ValueError("EAGLE-3 draft params must be {'params': head params, 'draft_ids': int32 [N]}")
        if dp["draft_ids"].shape != (self.cfg.draft_vocab_size,):
            raise ValueError(f"draft_ids has shape {dp['draft_ids'].shape}, expected ({self.cfg.draft_vocab_size},)")

    def _draw(self, key, h_BD, dp, ctx: Context, V: int):
        lg_BN = eagle3.logits(dp["params"], self.cfg, h_BD[:, None])[:, 0]
        return draw(key, lg_BN, ctx.sp, dp["draft_ids"], V)

    def init(self, tp, dp, pre: Prefill, cfg):
        B, S = pre.history_BS.shape
        T = pre.tokens_BT.shape[1]
        cache = eagle3.init_cache(self.cfg, B, S, dp["params"]["fc"].dtype)
        g_BTD = eagle3.fuse(dp["params"], pre.taps)
        # row s reads x_{s+1}; T may equal S, and rows >= the prompt length are overwritten later anyway
        rows_BT = jnp.pad(pre.history_BS[:, 1:], ((0, 0), (0, 1)))[:, :T]
        h_BTD, cache = eagle3.step(dp["params"], self.cfg, tp["embed"], rows_BT, g_BTD, cache)
        return {"cache": kv.set_lengths(cache, pre.lengths_B), "h_BD": row_at(h_BTD, pre.lengths_B - 1)}

    def propose(self, tp, dp, state, ctx: Context, target_cache, cfg):
        if self.tree is not None:
            return Proposal(self._tree_nodes(tp, dp, state), None), state, target_cache
        K, V = ctx.num_draft, cfg.vocab_size
        keys = jax.random.split(ctx.key, K)
        tok_B, q_BV = self._draw(keys[0], state["h_BD"], dp, ctx, V)
        if K == 1:
            return Proposal(tok_B[:, None], None if q_BV is None else q_BV[:, None]), state, target_cache

        def chain(carry, key):
            cache, h_BD, tok_B = carry
            h_B1D, cache = eagle3.step(dp["params"], self.cfg, tp["embed"], tok_B[:, None], h_BD[:, None], cache)
            nxt_B, q_BV = self._draw(key, h_B1D[:, 0], dp, ctx, V)
            return (cache, h_B1D[:, 0], nxt_B), (nxt_B, q_BV)

        _, (rest_NB, rest_q) = jax.lax.scan(chain, (state["cache"], state["h_BD"], tok_B), keys[1:])
        tokens_BK = jnp.concatenate([tok_B[:, None], rest_NB.T], axis=1)
        q_BKV = None if q_BV is None else jnp.concatenate([q_BV[:, None], rest_q.transpose(1, 0, 2)], axis=1)
        return Proposal(tokens_BK, q_BKV), state, target_cache  # the chain's rows are stale: keep the old cache

    def _tree_nodes(self, tp, dp, state):
        """Token ids [B, N] of the tree's nodes (draft-vocabulary ranks mapped to target ids)."""
        tree, params = self.tree, dp["params"]
        cache, L_B = state["cache"], state["cache"].lengths_B
        B, D = state["h_BD"].shape
        visible_NN = tree.ancestors[1:, 1:]  # node i's row sits at slot L + i - 1

        def children(h_BnD, d):  # the draft ids of the nodes at depth d, from their parents' outputs
            return tree_children(tree, eagle3.logits(params, self.cfg, h_BnD), d)

        ids = [children(state["h_BD"][:, None], 1)]
        h_BnD = jnp.broadcast_to(state["h_BD"][:, None], (B, ids[0].shape[1], D))
        for d in range(1, tree.depth):
            lo, hi = tree.level(d)
            pos_BT = jnp.broadcast_to((L_B + d - 1)[:, None], (B, hi - lo))
            out_BnD, cache = eagle3.step(params, self.cfg, tp["embed"], jnp.take(dp["draft_ids"], ids[-1]),
                                         h_BnD, kv.set_lengths(cache, L_B + lo - 1), pos_BT,
                                         (visible_NN[lo - 1:hi - 1], lo - 1))
            ids.append(children(out_BnD, d + 1))
            nlo, nhi = tree.level(d + 1)
            h_BnD = out_BnD[:, tree.parent[nlo:nhi] - lo]
        return jnp.take(dp["draft_ids"], jnp.concatenate(ids, axis=1)).astype(jnp.int32)

    def update(self, tp, dp, state, ver: Verified):
        K1 = ver.fed_BK1.shape[1]
        n_B = ver.num_new_B
        # row L+i reads x_{L+i+1}: fed[i+1] while inside the emitted run, the new last token at its end
        nxt_BK1 = jnp.concatenate([ver.fed_BK1[:, 1:], ver.last_B[:, None]], axis=1)
        rows_BK1 = jnp.where(jnp.arange(K1)[None, :] == (n_B - 1)[:, None], ver.last_B[:, None], nxt_BK1)
        cache = kv.set_lengths(state["cache"], ver.lengths_B - n_B)
        g_BTD = eagle3.fuse(dp["params"], ver.taps)
        h_BTD, cache = eagle3.step(dp["params"], self.cfg, tp["embed"], rows_BK1, g_BTD, cache)
        live_B1 = (n_B > 0)[:, None]
        h_BD = jnp.where(live_B1, row_at(h_BTD, jnp.maximum(n_B - 1, 0)), state["h_BD"])
        return {"cache": kv.set_lengths(cache, ver.lengths_B), "h_BD": h_BD}
