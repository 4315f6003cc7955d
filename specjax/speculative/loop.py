"""The speculative decoding loop on device: ``generate``, one jit of the prefill and one ``lax.while_loop``;
or, to time the first token, ``prefill`` and ``decode`` as two jits with the host in between.

Each cycle: the drafter proposes K tokens; ONE target forward scores ``[last, d_1..d_K]``;
``verify`` accepts a prefix and emits one more token; each sequence then advances by its own count
(cut at its EOS and its token budget), and both caches roll back by setting their lengths. The host
sees only the ``Outcome`` (tokens, counts), after the loop; with ``prefill`` + ``decode`` also the state
after the prefill (for TTFT), at ~4 ms more per request on an H200 (benchmarks/NOTES.md item 32).

With a draft tree (``drafter.tree``) the K = N drafts are the tree's nodes: the forward runs them under
the tree's attention mask, ``verify.tree_verify`` picks a path, the path's K/V rows move into position
order (``cache.gather_rows``) and the drafter's ``update`` sees the path as if it had been a chain.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import cache as kv
from specjax import model
from specjax.config import ModelConfig
from specjax.generate import is_eos
from specjax.sampling import SamplingParams, sample
from specjax.speculative import verify
from specjax.speculative.drafters.base import Context, Drafter, Prefill, Verified


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpecState:
    cycle: jax.Array  # int32: loop iterations so far
    history_BS: jax.Array  # int32: tokens by position (prompt, then generated); S = cache capacity
    last_B: jax.Array  # int32: last emitted token, at position cache.lengths_B (not yet in the cache)
    n_out_B: jax.Array  # int32: tokens generated per sequence (the prefill's token included)
    budget_B: jax.Array  # int32: max new tokens per sequence (max_new, capped by capacity)
    done_B: jax.Array  # bool: EOS emitted or budget reached
    cache: kv.KVCache  # the target's
    draft: Any  # the drafter's state
    key: jax.Array  # base key; cycle c uses fold_in(key, c)
    cycles_B: jax.Array  # int32: cycles each sequence was live in
    accepted_BK: jax.Array  # int32: per sequence, cycles in which draft position i was accepted
    drafted_B: jax.Array  # int32: drafts proposed per sequence (K, or a tree's N, per cycle; fewer when the drafter
    #                       stops early: ``Proposal.num_drafts_B``)


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "capacity", "num_draft", "eos_ids"))
def prefill(tp: dict, dp: Any, tokens_BT: jax.Array, prompt_len_B: jax.Array, max_new: jax.Array,
            sp: SamplingParams, key: jax.Array, *, cfg: ModelConfig, drafter: Drafter, capacity: int,
            num_draft: int, eos_ids: tuple[int, ...]) -> SpecState:
    """Target prefill + first token (drawn exactly as ``specjax.generate`` does) + drafter init."""
    B, T = tokens_BT.shape
    cache = kv.init_cache(cfg, B, capacity, tp["embed"].dtype)
    logits_BNV, taps, cache = model.forward(tp, cfg, tokens_BT, cache, taps=drafter.taps,
                                            logits_index_BN=(prompt_len_B - 1)[:, None])
    cache = kv.set_lengths(cache, prompt_len_B)
    key, sub = jax.random.split(key)
    tok_B = sample(sub, logits_BNV[:, 0], sp)
    rows_B = jnp.arange(B)
    history_BS = jnp.zeros((B, capacity), jnp.int32).at[:, :T].set(tokens_BT).at[rows_B, prompt_len_B].set(tok_B)
    # capacity guard (writes past the end would be clamped silently): verify writes L..L+K, history L+1..L+K+1
    depth = num_draft if drafter.tree is None else drafter.tree.depth  # the most drafts one cycle accepts
    budget_B = jnp.minimum(max_new, capacity - num_draft - 1 - prompt_len_B).astype(jnp.int32)
    draft_state = drafter.init(tp, dp, Prefill(tokens_BT, prompt_len_B, history_BS, taps), cfg)
    return SpecState(cycle=jnp.int32(0), history_BS=history_BS, last_B=tok_B, n_out_B=jnp.ones((B,), jnp.int32),
                     budget_B=budget_B, done_B=is_eos(tok_B, eos_ids) | (budget_B <= 1), cache=cache,
                     draft=draft_state, key=key, cycles_B=jnp.zeros((B,), jnp.int32),
                     accepted_BK=jnp.zeros((B, depth), jnp.int32), drafted_B=jnp.zeros((B,), jnp.int32))


def emit_count(v: verify.Verdict, eos_ids: tuple[int, ...], room_B: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Tokens to keep from ``v.tokens_BK1``: the n+1 emitted, cut after the first EOS and at the budget.

    Returns (count_B, hit_eos_B): hit_eos when an EOS is among the kept tokens.
    """
    K1 = v.tokens_BK1.shape[1]
    valid_BK1 = jnp.arange(K1)[None, :] <= v.num_accepted_B[:, None]
    eos_BK1 = is_eos(v.tokens_BK1, eos_ids) & valid_BK1
    first_eos_B = jnp.where(eos_BK1.any(axis=1), jnp.argmax(eos_BK1, axis=1), K1)
    count_B = jnp.minimum(jnp.minimum(v.num_accepted_B + 1, first_eos_B + 1), room_B)
    return count_B.astype(jnp.int32), first_eos_B < count_B


def _write_rows(history_BS: jax.Array, new_BN: jax.Array, start_B: jax.Array) -> jax.Array:
    return jax.vmap(lambda h_S, x_N, s: jax.lax.dynamic_update_slice(h_S, x_N, (s,)))(history_BS, new_BN, start_B)


def _score(tp, cfg, drafter, prop, s: SpecState, cache, sp, key):
    """The target forward over ``[last, drafts]`` and the verdict; for a tree, the accepted path's K/V moved
    into position order and the fed tokens and taps taken along it (what ``update`` sees of a chain)."""
    L_B, tree = s.cache.lengths_B, drafter.tree
    fed_BK1 = jnp.concatenate([s.last_B[:, None], prop.tokens_BK.astype(jnp.int32)], axis=1)
    logits_BK1V, taps, cache = model.forward(tp, cfg, fed_BK1, kv.set_lengths(cache, L_B), taps=drafter.taps,
                                             tree_TT=None if tree is None else tree.ancestors)
    if tree is None:
        v = verify.verify(key, logits_BK1V, prop.tokens_BK, prop.q_BKV, sp, prop.num_drafts_B)
        return v, fed_BK1, taps, cache
    v = verify.tree_verify(key, logits_BK1V, prop.tokens_BK, tree, sp)
    taps = tuple(jnp.take_along_axis(t, v.nodes_BK1[:, :, None], axis=1) for t in taps)
    return v, jnp.take_along_axis(fed_BK1, v.nodes_BK1, axis=1), taps, kv.gather_rows(cache, L_B, v.nodes_BK1)


def _cycle(tp, dp, s: SpecState, sp, cfg, drafter, eos_ids) -> SpecState:
    B, K = s.accepted_BK.shape  # K: the most drafts a cycle accepts (a tree's depth)
    key_draft, key_verify = jax.random.split(jax.random.fold_in(s.key, s.cycle))
    L_B = s.cache.lengths_B
    num_draft = K if drafter.tree is None else drafter.tree.num_nodes
    ctx = Context(s.history_BS, L_B, s.last_B, key_draft, sp, num_draft=num_draft)  # greedy: sp.is_greedy (static)
    prop, draft_state, cache = drafter.propose(tp, dp, s.draft, ctx, s.cache, cfg)
    v, fed_BK1, taps, cache = _score(tp, cfg, drafter, prop, s, cache, sp, key_verify)

    live_B = ~s.done_B
    count_B, hit_eos_B = emit_count(v, eos_ids, s.budget_B - s.n_out_B)
    count_B = jnp.where(live_B, count_B, 0)
    last_B = jnp.where(count_B > 0, jnp.take_along_axis(v.tokens_BK1, jnp.maximum(count_B - 1, 0)[:, None], 1)[:, 0],
                       s.last_B)
    new_L_B = L_B + count_B
    n_out_B = s.n_out_B + count_B
    ver = Verified(fed_BK1, taps, v.num_accepted_B, count_B, new_L_B, last_B, v.nodes_BK1)
    live_i = live_B.astype(jnp.int32)
    return SpecState(
        cycle=s.cycle + 1,
        history_BS=_write_rows(s.history_BS, v.tokens_BK1, L_B + 1),  # only [0, count) is kept
        last_B=last_B, n_out_B=n_out_B, budget_B=s.budget_B,
        done_B=s.done_B | (live_B & hit_eos_B) | (n_out_B >= s.budget_B),
        cache=kv.set_lengths(cache, new_L_B),
        draft=drafter.update(tp, dp, draft_state, ver), key=s.key,
        cycles_B=s.cycles_B + live_i,
        accepted_BK=s.accepted_BK + live_i[:, None] * (jnp.arange(K)[None, :] < v.num_accepted_B[:, None]),
        drafted_B=s.drafted_B + live_i * (num_draft if prop.num_drafts_B is None else prop.num_drafts_B),
    )


def _decode(tp: dict, dp: Any, state: SpecState, sp: SamplingParams, *, cfg: ModelConfig, drafter: Drafter,
            eos_ids: tuple[int, ...]) -> SpecState:
    """Run cycles until every sequence is done (each live cycle emits >= 1 token, so this ends)."""
    body = functools.partial(_cycle, tp, dp, sp=sp, cfg=cfg, drafter=drafter, eos_ids=eos_ids)
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done_B), body, state)


_STATIC = ("cfg", "drafter", "eos_ids")
decode = jax.jit(_decode, static_argnames=_STATIC)
decode_donating = jax.jit(_decode, static_argnames=_STATIC, donate_argnames=("state",))  # no cache copies on GPU


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the host reads after the loop."""
    history_BS: jax.Array
    n_out_B: jax.Array
    cycles_B: jax.Array
    accepted_BK: jax.Array
    drafted_B: jax.Array


def outcome(state: SpecState) -> Outcome:
    return Outcome(state.history_BS, state.n_out_B, state.cycles_B, state.accepted_BK, state.drafted_B)


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "capacity", "num_draft", "eos_ids"))
def generate(tp: dict, dp: Any, tokens_BT: jax.Array, prompt_len_B: jax.Array, max_new: jax.Array,
             sp: SamplingParams, key: jax.Array, *, cfg: ModelConfig, drafter: Drafter, capacity: int,
             num_draft: int, eos_ids: tuple[int, ...]) -> Outcome:
    """``prefill`` then ``decode`` in one program, returning only the ``Outcome``: the loop's state (both
    caches) is never a program argument or result, as in ``specjax.generate`` (item 32: ~4 ms less per
    request than the two jits)."""
    state = prefill(tp, dp, tokens_BT, prompt_len_B, max_new, sp, key, cfg=cfg, drafter=drafter,
                    capacity=capacity, num_draft=num_draft, eos_ids=eos_ids)
    return outcome(_decode(tp, dp, state, sp, cfg=cfg, drafter=drafter, eos_ids=eos_ids))


def compile_prefill_decode(pre_args: tuple, sp: SamplingParams, *, capacity: int, num_draft: int, cfg: ModelConfig,
                           drafter: Drafter, eos_ids: tuple[int, ...]):
    """``prefill`` and ``decode`` compiled for ``prefill``'s arguments (cached per bucket), the decode donating
    its state on GPUs: the two programs of a request whose first token is timed."""
    static = dict(cfg=cfg, drafter=drafter, eos_ids=eos_ids)
    pre = functools.partial(prefill, capacity=capacity, num_draft=num_draft, **static)
    decode_jit = decode_donating if jax.default_backend() != "cpu" else decode
    return (prefill.lower(*pre_args, capacity=capacity, num_draft=num_draft, **static).compile(),
            decode_jit.lower(pre_args[0], pre_args[1], jax.eval_shape(pre, *pre_args), sp, **static).compile())


def outputs(out: Outcome | SpecState, prompt_len_B) -> list[list[int]]:
    """Generated tokens per sequence (host side, after the loop)."""
    hist, n_B = np.asarray(out.history_BS), np.asarray(out.n_out_B)
    return [hist[b, int(p):int(p) + int(n)].tolist() for b, (p, n) in enumerate(zip(np.asarray(prompt_len_B), n_B))]
