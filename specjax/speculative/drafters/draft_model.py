"""A separate (smaller) draft model with the target's vocabulary, decoding K tokens autoregressively.

Its cache mirrors the target's positions. Each cycle starts by re-feeding the token at L-1 together
with ``last`` (a 2-token step at positions L-1, L): when all K drafts were accepted, d_K never went
through the draft model, and re-feeding one already-cached token is cheaper than a ragged branch.
Rollback is then just setting the draft cache's lengths to L-1, so ``update`` has nothing to do.
Cost per cycle: one 2-token step + (K-1) 1-token steps of the draft model.

``min_confidence`` c > 0 makes the chain adaptive: a row stops drafting after a token whose draft probability
(``base.confidence``) is below c, and the cycle's draft loop (a ``lax.while_loop``) ends once every row has
stopped; the target still verifies K+1 rows, of which only the drafted ones can be accepted
(``Proposal.num_drafts_B``). Lossless either way: the stop depends on the draft model alone. With c = 0 (the
default) every cycle drafts K tokens in a ``lax.scan``. On SmolLM2 with the shipped draft model K=10 at c=0.3 was
2-3 % faster than K=5 on MT-bench and 5 % slower on HumanEval (benchmarks/NOTES.md item 44).

``restrict_vocab`` keeps only N rows of the draft model's LM head (e.g. the N most frequent tokens, as FR-Spec
does and as EAGLE-3's draft vocabulary is chosen): each draft step then reads N x D instead of V x D head weights.
It stays lossless: the target verifies every draft, and when sampling q is the restricted distribution.

With a ``tree`` the draft model drafts a static draft tree level by level, as ``Eagle3`` does: the children of a
node are the draft model's top-ranked tokens at that node (over its draft vocabulary), and the nodes of depth d run
as one forward of as many rows at position L + d, written to scratch slots L + i (node i), each seeing the context
and its ancestors (``model.forward(tree_rows=...)``): one 2-token step and depth - 1 tree steps per cycle. The
verifier picks a path (``verify.tree_verify``); ``update`` then moves that path's K/V rows to slots L+1, L+2, ...
(``cache.gather_rows``), so the cache again mirrors the target's positions.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax import cache as kv
from specjax import model
from specjax.config import ModelConfig
from specjax.speculative.drafters.base import (Context, Drafter, Prefill, Proposal, Verified, check_min_confidence,
                                               confidence, draw, tree_children)
from specjax.speculative.tree import Tree


@dataclasses.dataclass(frozen=True)
class DraftModel(Drafter):
    name: ClassVar[str] = "draft"
    cfg: ModelConfig  # the draft model's config; draft params travel as ``dp``
    min_confidence: float = 0.0  # stop a row's chain after a draft below this probability (0: always K drafts)
    tree: Tree | None = None  # a static draft tree (None: a chain)

    def validate(self, cfg: ModelConfig, dp, num_draft: int) -> None:
        super().validate(cfg, dp, num_draft)
        check_min_confidence(self)
        if self.tree is not None and self.min_confidence:
            raise ValueError("a draft tree drafts every node; min_confidence (an adaptive chain) applies to chains "
                             "only")
        if self.cfg.vocab_size != cfg.vocab_size:
            raise ValueError(f"draft model vocabulary ({self.cfg.vocab_size} tokens) differs from the target's "
                             f"({cfg.vocab_size}); a draft model must share the target's tokenizer and vocabulary")
        if not isinstance(dp, dict) or "embed" not in dp:
            raise ValueError("the draft-model drafter needs the draft model's params dict as draft_params")
        if dp["embed"].shape[0] != cfg.vocab_size:
            raise ValueError(f"draft params have an embedding of {dp['embed'].shape[0]} rows; the target's vocabulary "
                             f"has {cfg.vocab_size} tokens")
        head = None if self.cfg.tie_embeddings else dp.get("lm_head")
        if "vocab_ids" in dp and (head is None or head.shape[0] != dp["vocab_ids"].shape[0]):
            raise ValueError("draft params with 'vocab_ids' need an untied LM head of one row per id: build them "
                             "with draft_model.restrict_vocab")

    def init(self, tp, dp, pre: Prefill, cfg):
        B, S = pre.history_BS.shape
        cache = kv.init_cache(self.cfg, B, S, dp["embed"].dtype)
        _, _, cache = model.forward(dp, self.cfg, pre.tokens_BT, cache, compute_logits=False)
        return kv.set_lengths(cache, pre.lengths_B)

    def propose(self, tp, dp, cache: kv.KVCache, ctx: Context, target_cache, cfg):
        K = ctx.num_draft
        L_B = ctx.lengths_B
        prev_B = jnp.take_along_axis(ctx.history_BS, (L_B - 1)[:, None], axis=1)[:, 0]
        cache = kv.set_lengths(cache, L_B - 1)
        logits_B1V, _, cache = model.forward(dp, self.cfg, jnp.stack([prev_B, ctx.last_B], axis=1), cache,
                                             logits_index_BN=jnp.ones((L_B.shape[0], 1), jnp.int32))
        if self.tree is not None:  # its nodes are the top-ranked tokens: nothing drawn (q None, one-hot)
            nodes_BN, cache = self._tree_nodes(dp, cache, L_B, logits_B1V[:, 0])
            return Proposal(nodes_BN, None), cache, target_cache
        keys = jax.random.split(ctx.key, K)
        tok_B, q_BV = draw(keys[0], logits_B1V[:, 0], ctx.sp, dp.get("vocab_ids"), cfg.vocab_size)
        if K == 1:
            return Proposal(tok_B[:, None], None if q_BV is None else q_BV[:, None]), cache, target_cache
        if self.min_confidence > 0:
            prop, cache = self._propose_adaptive(dp, cache, ctx, keys, logits_B1V[:, 0], tok_B, q_BV, cfg)
            return prop, cache, target_cache

        def step(carry, key):
            _, nxt_B, q_BV, cache = self._next(dp, *carry, key, ctx, cfg)
            return (cache, nxt_B), (nxt_B, q_BV)

        (cache, _), (rest_NB, rest_q_NBV) = jax.lax.scan(step, (cache, tok_B), keys[1:])
        tokens_BK = jnp.concatenate([tok_B[:, None], rest_NB.T], axis=1)
        q_BKV = None if q_BV is None else jnp.concatenate([q_BV[:, None], rest_q_NBV.transpose(1, 0, 2)], axis=1)
        return Proposal(tokens_BK, q_BKV), cache, target_cache

    def _tree_nodes(self, dp, cache, L_B, logits_BV):
        """Token ids [B, N] of the tree's nodes, from the logits at ``last`` (slot L) on; node i's K/V go to slot
        L + i."""
        tree, ids_N = self.tree, dp.get("vocab_ids")
        visible_NN = tree.ancestors[1:, 1:]

        def children(logits_BnV, d):  # the tokens of the nodes at depth d, from their parents' logits
            rows_Bn = tree_children(tree, logits_BnV, d)
            return (rows_Bn if ids_N is None else jnp.take(ids_N, rows_Bn)).astype(jnp.int32)

        toks = [children(logits_BV[:, None], 1)]
        for d in range(1, tree.depth):
            lo, hi = tree.level(d)
            logits_BnV, _, cache = model.forward(dp, self.cfg, toks[-1], kv.set_lengths(cache, L_B + lo),
                                                 tree_rows=(visible_NN[lo - 1:hi - 1], lo - 1, d))
            toks.append(children(logits_BnV, d + 1))
        return jnp.concatenate(toks, axis=1), cache

    def update(self, tp, dp, cache: kv.KVCache, ver: Verified) -> kv.KVCache:
        if self.tree is None:  # a chain's drafts sit at their positions already (rollback = the next set_lengths)
            return cache
        # the path's nodes 1..n: from slots L + node to L + 1..L + n (only the first n - 1 are read again)
        start_B = ver.lengths_B - ver.num_new_B + 1
        return kv.gather_rows(cache, start_B, jnp.maximum(ver.nodes_BK1[:, 1:] - 1, 0))

    def _next(self, dp, cache, tok_B, key, ctx: Context, cfg):
        """One 1-token draft step after ``tok_B``: (its logits [B, N], the next draft [B], its q or None, cache)."""
        logits_B1V, _, cache = model.forward(dp, self.cfg, tok_B[:, None], cache)
        nxt_B, q_BV = draw(key, logits_B1V[:, 0], ctx.sp, dp.get("vocab_ids"), cfg.vocab_size)
        return logits_B1V[:, 0], nxt_B, q_BV, cache

    def _propose_adaptive(self, dp, cache, ctx: Context, keys, logits_BV, tok_B, q_BV, cfg):
        """Drafts 2..K in a ``lax.while_loop`` that runs while some row is still drafting (``min_confidence``)."""
        K, B = ctx.num_draft, tok_B.shape[0]
        tokens_BK = jnp.zeros((B, K), jnp.int32).at[:, 0].set(tok_B)
        q_BKV = None if q_BV is None else jnp.zeros((B, K, q_BV.shape[-1]), q_BV.dtype).at[:, 0].set(q_BV)
        live_B = confidence(logits_BV, tok_B, q_BV) >= self.min_confidence
        init = (jnp.int32(1), cache, tok_B, tokens_BK, q_BKV, jnp.ones((B,), jnp.int32), live_B)

        def more(carry):
            i, *_, live_B = carry
            return (i < K) & jnp.any(live_B)

        def step(carry):
            i, cache, tok_B, tokens_BK, q_BKV, n_B, live_B = carry
            logits_BV, nxt_B, q_BV, cache = self._next(dp, cache, tok_B, keys[i], ctx, cfg)
            tokens_BK = tokens_BK.at[:, i].set(nxt_B)
            if q_BKV is not None:
                q_BKV = q_BKV.at[:, i].set(q_BV)
            n_B = jnp.where(live_B, i + 1, n_B)
            live_B = live_B & (confidence(logits_BV, nxt_B, q_BV) >= self.min_confidence)
            return i + 1, cache, nxt_B, tokens_BK, q_BKV, n_B, live_B

        _, cache, _, tokens_BK, q_BKV, n_B, _ = jax.lax.while_loop(more, step, init)
        return Proposal(tokens_BK, q_BKV, n_B), cache


def restrict_vocab(cfg: ModelConfig, dp: dict, ids_N) -> tuple[ModelConfig, dict]:
    """``(cfg, params)`` of a draft model that proposes only the tokens ``ids_N`` (distinct target ids): its LM head
    becomes those N rows (untied), and ``params["vocab_ids"]`` maps a head row back to its token."""
    if "vocab_ids" in dp:
        raise ValueError("these draft params are restricted already; restrict the full model (e.g. "
                         "draft_io.load_draft_model(..., full_vocab=True))")
    ids_N = np.asarray(ids_N)
    if ids_N.ndim != 1 or not np.issubdtype(ids_N.dtype, np.integer) or ids_N.size == 0:
        raise ValueError(f"vocab ids must be a non-empty 1-D array of token ids, got shape {ids_N.shape} "
                         f"of {ids_N.dtype}")
    if ids_N.min() < 0 or ids_N.max() >= cfg.vocab_size or np.unique(ids_N).size != ids_N.size:
        raise ValueError(f"vocab ids must be distinct token ids in [0, {cfg.vocab_size}), got {ids_N.size} ids in "
                         f"[{ids_N.min()}, {ids_N.max()}] ({ids_N.size - np.unique(ids_N).size} repeated)")
    w_VD = dp["embed"] if cfg.tie_embeddings else dp["lm_head"]
    ids = jnp.asarray(ids_N, jnp.int32)
    return dataclasses.replace(cfg, tie_embeddings=False), dp | {"lm_head": jnp.take(w_VD, ids, axis=0),
                                                                  "vocab_ids": ids}
