"""Exact verification: the only place where drafted tokens are accepted or rejected.

Given the target's logits at the K+1 fed positions ``[last, d_1..d_K]`` (row i predicts the token
after position L+i) and the drafts ``d_1..d_K`` with the distributions ``q`` they were drawn from:

* greedy (temperature 0): accept while ``d_{i+1} == argmax p_i``; the emitted tokens are the
  target's argmaxes ``t_0..t_n`` (the n accepted drafts, then the correction or the bonus ``t_K``).
* sampling: Leviathan et al. / Chen et al. rejection sampling. Accept ``d_{i+1}`` with probability
  ``min(1, p_i(d) / q_i(d))``; at the first rejection draw from ``norm(max(0, p_n - q_n))``; after
  K acceptances draw the bonus from ``p_K``. ``p`` and ``q`` both come from ``sampling.probs``
  (same temperature, top-k, top-p). ``q = None`` (n-gram and other deterministic drafters) means
  one-hot: accept with probability ``p(d)`` and draw a rejection from p with d removed.
* a drafter that stopped early (``num_drafts_B`` = m < K: slots past m are padding) is treated as having
  drafted nothing at position m: at most m drafts are accepted, and after m acceptances the next token is
  the target's own (its argmax, or a draw from ``p_m``: the residual of p against no draft). Where to stop
  may depend on anything the drafter computed, never on the target, so this stays exact.
The output distribution equals the target's exactly, whatever the drafter proposes.

Draft trees (``tree.Tree``; N nodes fed as ``[last, n_1..n_N]``, row i predicting the token after node i):

* greedy: node i is accepted when it equals the argmax of its parent's row and so is every ancestor;
  the deepest accepted node ends the path, and the emitted tokens are the argmaxes along it.
* sampling: tree nodes are deterministic (a drafter's top-ranked tokens), so at each node the children
  are tried in rank order as one-hot drafts against the current distribution: accept child x with
  probability ``p'(x)``; on rejection ``p' <- norm(p' with x removed)`` (the residual against a one-hot q)
  and try the next child. When all children are rejected (or at a leaf) the next token is drawn from
  ``p'``. Each try is an exact rejection step targeting ``p'``, so every emitted token has the target's
  distribution (SpecInfer's multi-draft verification with deterministic drafts).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import sampling
from specjax.sampling import SamplingParams
from specjax.speculative.tree import Tree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Verdict:
    num_accepted_B: jax.Array  # int32 n in [0, K]: drafts accepted
    tokens_BK1: jax.Array  # int32: d_1..d_n, then the correction/bonus at index n (later slots: padding)
    nodes_BK1: jax.Array | None = None  # trees: the fed rows of the accepted path (root 0, its n nodes, padding)


def accepted_prefix(ok_BK: jax.Array) -> jax.Array:
    """Length of the leading run of True per row."""
    return jnp.sum(jnp.cumprod(ok_BK.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def drafted(draft_BK: jax.Array, num_drafts_B: jax.Array | None) -> jax.Array:
    """[B, K] True where slot i holds a draft (i < num_drafts; every slot when None)."""
    if num_drafts_B is None:
        return jnp.ones(draft_BK.shape, bool)
    return jnp.arange(draft_BK.shape[1])[None, :] < num_drafts_B[:, None]


def greedy_verify(logits_BK1V: jax.Array, draft_BK: jax.Array, num_drafts_B: jax.Array | None = None) -> Verdict:
    target_BK1 = jnp.argmax(logits_BK1V, axis=-1).astype(jnp.int32)
    n_B = accepted_prefix((draft_BK == target_BK1[:, :-1]) & drafted(draft_BK, num_drafts_B))
    return Verdict(n_B, target_BK1)  # accepted drafts equal the argmaxes, so t_0..t_n is the output


def residual_distribution(p_BV: jax.Array, q_BV: jax.Array) -> jax.Array:
    """``norm(max(0, p - q))``: where a rejected position draws its replacement.

    The mass is zero only when p == q, where a rejection has probability zero; p is returned then.
    """
    r_BV = jnp.maximum(p_BV - q_BV, 0.0)
    mass_B1 = jnp.sum(r_BV, axis=-1, keepdims=True)
    return jnp.where(mass_B1 > 0, r_BV / jnp.where(mass_B1 > 0, mass_B1, 1.0), p_BV)


def rejection_verify(key: jax.Array, logits_BK1V: jax.Array, draft_BK: jax.Array, q_BKV: jax.Array | None,
                     sp: SamplingParams, num_drafts_B: jax.Array | None = None) -> Verdict:
    B, K1, V = logits_BK1V.shape
    K = K1 - 1
    p_BK1V = sampling.probs(logits_BK1V, sp)
    p_draft_BK = jnp.take_along_axis(p_BK1V[:, :K], draft_BK[..., None], axis=-1)[..., 0]
    if q_BKV is None:
        q_draft_BK = jnp.ones_like(p_draft_BK)
    else:
        q_draft_BK = jnp.take_along_axis(q_BKV, draft_BK[..., None], axis=-1)[..., 0]
    key_accept, key_residual = jax.random.split(key)
    u_BK = jax.random.uniform(key_accept, (B, K), jnp.float32)
    n_B = accepted_prefix((u_BK * q_draft_BK < p_draft_BK) & drafted(draft_BK, num_drafts_B))  # u < p/q, no division
    p_n_BV = jnp.take_along_axis(p_BK1V, n_B[:, None, None], axis=1)[:, 0]
    rejected_B1 = (n_B < (K if num_drafts_B is None else num_drafts_B))[:, None]  # else every draft was accepted
    row_B = jnp.minimum(n_B, K - 1)  # the rejected draft's row (unused after full acceptance)
    if q_BKV is None:
        d_n_B = jnp.take_along_axis(draft_BK, row_B[:, None], axis=1)[:, 0]
        q_n_BV = jax.nn.one_hot(d_n_B, V, dtype=jnp.float32)
    else:
        q_n_BV = jnp.take_along_axis(q_BKV, row_B[:, None, None], axis=1)[:, 0]
    q_n_BV = jnp.where(rejected_B1, q_n_BV, 0.0)  # bonus: residual of p against nothing = p_n
    next_B = sampling.sample_from_probs(key_residual, residual_distribution(p_n_BV, q_n_BV))
    i_K1 = jnp.arange(K1)[None, :]
    draft_BK1 = jnp.concatenate([draft_BK, jnp.zeros((B, 1), jnp.int32)], axis=1)
    return Verdict(n_B, jnp.where(i_K1 < n_B[:, None], draft_BK1, next_B[:, None]))


def verify(key: jax.Array, logits_BK1V: jax.Array, draft_BK: jax.Array, q_BKV: jax.Array | None,
           sp: SamplingParams, num_drafts_B: jax.Array | None = None) -> Verdict:
    """Accept the longest valid prefix of the drafts and emit one more token (see module doc).

    ``num_drafts_B``: drafts proposed per row when a drafter stopped before K (None: all K).
    Greedy or not is static (``sp.is_greedy``, fixed on the host), so greedy decoding never sorts the vocab.
    """
    if logits_BK1V.shape[1] != draft_BK.shape[1] + 1:
        raise ValueError(f"verify needs K+1 logit rows for K drafts, got {logits_BK1V.shape[1]} rows "
                         f"and {draft_BK.shape[1]} drafts")
    if sp.is_greedy:
        return greedy_verify(logits_BK1V, draft_BK, num_drafts_B)
    return rejection_verify(key, logits_BK1V, draft_BK, q_BKV, sp, num_drafts_B)


def greedy_tree_verify(logits_BN1V: jax.Array, nodes_BN: jax.Array, tree: Tree) -> Verdict:
    t_BN1 = jnp.argmax(logits_BN1V, axis=-1).astype(jnp.int32)
    ok_BN = nodes_BN == t_BN1[:, tree.parent[1:]]
    ok_BN1 = jnp.concatenate([jnp.ones_like(ok_BN[:, :1]), ok_BN], axis=1)
    accepted_BN1 = ~jnp.any(jnp.asarray(tree.ancestors)[None] & ~ok_BN1[:, None, :], axis=-1)
    n1 = tree.num_nodes + 1
    score_BN1 = jnp.where(accepted_BN1, jnp.asarray(tree.depths) * n1 - jnp.arange(n1), -1)  # deepest, then first
    end_B = jnp.argmax(score_BN1, axis=1)
    path_BD1 = jnp.asarray(tree.path_to)[end_B]
    n_B = jnp.asarray(tree.depths)[end_B]
    return Verdict(n_B, jnp.take_along_axis(t_BN1, path_BD1, axis=1), path_BD1)


def _remove(p_BV: jax.Array, x_B: jax.Array, where_B: jax.Array) -> jax.Array:
    """``norm(p with x removed)`` where ``where_B`` (the residual of p against a one-hot draft at x), else p."""
    r_BV = jnp.where(jnp.arange(p_BV.shape[-1])[None, :] == x_B[:, None], 0.0, p_BV)
    return jnp.where(where_B[:, None], residual_distribution(r_BV, jnp.zeros_like(r_BV)), p_BV)


def rejection_tree_verify(key: jax.Array, logits_BN1V: jax.Array, nodes_BN: jax.Array, tree: Tree,
                          sp: SamplingParams) -> Verdict:
    B, N1, V = logits_BN1V.shape
    D = tree.depth
    p_BN1V = sampling.probs(logits_BN1V, sp)
    fed_BN1 = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), nodes_BN.astype(jnp.int32)], axis=1)
    children = jnp.asarray(tree.children)
    rows_B = jnp.arange(B)
    key_walk, key_final = jax.random.split(key)
    cur_B = jnp.zeros((B,), jnp.int32)
    stopped_B = jnp.zeros((B,), bool)
    final_BV = jnp.zeros((B, V), jnp.float32)
    for d in range(D + 1):  # a node at depth D has no children: the walk stops there at the latest
        p_BV = p_BN1V[rows_B, cur_B]
        moved_B, nxt_B = jnp.zeros((B,), bool), cur_B
        for m in range(children.shape[1]):
            c_B = children[cur_B, m]
            try_B = (c_B >= 0) & ~moved_B & ~stopped_B
            x_B = fed_BN1[rows_B, jnp.maximum(c_B, 0)]
            u_B = jax.random.uniform(jax.random.fold_in(key_walk, d * children.shape[1] + m), (B,))
            ok_B = try_B & (u_B < p_BV[rows_B, x_B])
            moved_B, nxt_B = moved_B | ok_B, jnp.where(ok_B, c_B, nxt_B)
            p_BV = _remove(p_BV, x_B, try_B & ~ok_B)
        stop_B = ~stopped_B & ~moved_B
        final_BV = jnp.where(stop_B[:, None], p_BV, final_BV)
        stopped_B, cur_B = stopped_B | stop_B, jnp.where(stopped_B, cur_B, nxt_B)
    next_B = sampling.sample_from_probs(key_final, final_BV)
    path_BD1 = jnp.asarray(tree.path_to)[cur_B]
    n_B = jnp.asarray(tree.depths)[cur_B]
    along_BD1 = jnp.take_along_axis(fed_BN1, path_BD1, axis=1)  # the root's slot, then the accepted nodes
    tokens_BD1 = jnp.where(jnp.arange(D + 1)[None, :] < n_B[:, None], jnp.roll(along_BD1, -1, axis=1),
                           next_B[:, None])
    return Verdict(n_B, tokens_BD1, path_BD1)


def tree_verify(key: jax.Array, logits_BN1V: jax.Array, nodes_BN: jax.Array, tree: Tree,
                sp: SamplingParams) -> Verdict:
    """Accept the longest path of the draft tree the target agrees with and emit one more token (module doc).

    Returns ``Verdict(n, tokens [B, depth + 1], nodes [B, depth + 1])``: the fed rows along the path."""
    if logits_BN1V.shape[1] != tree.num_nodes + 1 or nodes_BN.shape[1] != tree.num_nodes:
        raise ValueError(f"tree verify needs N+1 logit rows for N = {tree.num_nodes} nodes, got "
                         f"{logits_BN1V.shape[1]} rows and {nodes_BN.shape[1]} nodes")
    if sp.is_greedy:
        return greedy_tree_verify(logits_BN1V, nodes_BN, tree)
    return rejection_tree_verify(key, logits_BN1V, nodes_BN, tree, sp)
