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
The output distribution equals the target's exactly, whatever the drafter proposes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import sampling
from specjax.sampling import SamplingParams


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Verdict:
    num_accepted_B: jax.Array  # int32 n in [0, K]: drafts accepted
    tokens_BK1: jax.Array  # int32: d_1..d_n, then the correction/bonus at index n (later slots: padding)


def accepted_prefix(ok_BK: jax.Array) -> jax.Array:
    """Length of the leading run of True per row."""
    return jnp.sum(jnp.cumprod(ok_BK.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def greedy_verify(logits_BK1V: jax.Array, draft_BK: jax.Array) -> Verdict:
    target_BK1 = jnp.argmax(logits_BK1V, axis=-1).astype(jnp.int32)
    n_B = accepted_prefix(draft_BK == target_BK1[:, :-1])
    return Verdict(n_B, target_BK1)  # accepted drafts equal the argmaxes, so t_0..t_n is the output


def residual_distribution(p_BV: jax.Array, q_BV: jax.Array) -> jax.Array:
    """``norm(max(0, p - q))``: where a rejected position draws its replacement.

    The mass is zero only when p == q, where a rejection has probability zero; p is returned then.
    """
    r_BV = jnp.maximum(p_BV - q_BV, 0.0)
    mass_B1 = jnp.sum(r_BV, axis=-1, keepdims=True)
    return jnp.where(mass_B1 > 0, r_BV / jnp.where(mass_B1 > 0, mass_B1, 1.0), p_BV)


def rejection_verify(key: jax.Array, logits_BK1V: jax.Array, draft_BK: jax.Array, q_BKV: jax.Array | None,
                     sp: SamplingParams) -> Verdict:
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
    n_B = accepted_prefix(u_BK * q_draft_BK < p_draft_BK)  # u < p/q without dividing by q
    p_n_BV = jnp.take_along_axis(p_BK1V, n_B[:, None, None], axis=1)[:, 0]
    rejected_B1 = (n_B < K)[:, None]
    row_B = jnp.minimum(n_B, K - 1)  # the rejected draft's row (unused after full acceptance)
    if q_BKV is None:
        d_n_B = jnp.take_along_axis(draft_BK, row_B[:, None], axis=1)[:, 0]
        q_n_BV = jax.nn.one_hot(d_n_B, V, dtype=jnp.float32)
    else:
        q_n_BV = jnp.take_along_axis(q_BKV, row_B[:, None, None], axis=1)[:, 0]
    q_n_BV = jnp.where(rejected_B1, q_n_BV, 0.0)  # bonus: residual of p against nothing = p_K
    next_B = sampling.sample_from_probs(key_residual, residual_distribution(p_n_BV, q_n_BV))
    i_K1 = jnp.arange(K1)[None, :]
    draft_BK1 = jnp.concatenate([draft_BK, jnp.zeros((B, 1), jnp.int32)], axis=1)
    return Verdict(n_B, jnp.where(i_K1 < n_B[:, None], draft_BK1, next_B[:, None]))


def verify(key: jax.Array, logits_BK1V: jax.Array, draft_BK: jax.Array, q_BKV: jax.Array | None,
           sp: SamplingParams) -> Verdict:
    """Accept the longest valid prefix of the drafts and emit one more token (see module doc).

    Greedy or not is static (``sp.is_greedy``, fixed on the host), so greedy decoding never sorts the vocab.
    """
    if logits_BK1V.shape[1] != draft_BK.shape[1] + 1:
        raise ValueError(f"verify needs K+1 logit rows for K drafts, got {logits_BK1V.shape[1]} rows "
                         f"and {draft_BK.shape[1]} drafts")
    if sp.is_greedy:
        return greedy_verify(logits_BK1V, draft_BK)
    return rejection_verify(key, logits_BK1V, draft_BK, q_BKV, sp)
