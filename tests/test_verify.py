"""verify.py on synthetic logits (no model): greedy rules, and rejection sampling's exactness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax import sampling
from specjax.sampling import SamplingParams
from specjax.speculative import verify

V = 8


def test_greedy_accepts_matching_prefix_then_corrects_or_adds_bonus():
    logits = jnp.full((3, 4, V), -1.0)
    target = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    logits = logits.at[jnp.arange(3)[:, None], jnp.arange(4)[None, :], target].set(5.0)
    drafts = jnp.array([[1, 2, 3], [1, 7, 3], [0, 2, 3]], jnp.int32)
    v = verify.verify(jax.random.key(0), logits, drafts, None, SamplingParams.make())
    assert v.num_accepted_B.tolist() == [3, 1, 0]
    # emitted: accepted drafts, then the target's token (bonus 4 after full acceptance)
    assert v.tokens_BK1[0].tolist() == [1, 2, 3, 4]
    assert v.tokens_BK1[1, :2].tolist() == [1, 2]
    assert v.tokens_BK1[2, :1].tolist() == [1]


def test_verify_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="K\\+1 logit rows"):
        verify.verify(jax.random.key(0), jnp.zeros((1, 3, V)), jnp.zeros((1, 3), jnp.int32), None,
                      SamplingParams.make())


def test_rejection_accepts_everything_when_q_equals_p():
    logits = jax.random.normal(jax.random.key(1), (512, 3, V))
    sp = SamplingParams.make(1.0)
    q = sampling.probs(logits[:, :2], sp)
    drafts = sampling.sample_from_probs(jax.random.key(2), q)
    v = verify.rejection_verify(jax.random.key(3), logits, drafts, q, sp)
    assert bool(jnp.all(v.num_accepted_B == 2))
    assert bool(jnp.all(v.tokens_BK1[:, :2] == drafts))


def _pvalue(counts, p):
    """Pearson chi-square goodness of fit of counts to p (float32 probabilities renormalised)."""
    return stats.chisquare(counts, p / p.sum() * counts.sum()).pvalue


def _setting(top_p):
    """Fixed target logits (K+1 = 3 rows) and a different draft distribution for the K = 2 drafts."""
    logits_K1V = 2.0 * jax.random.normal(jax.random.key(10), (3, V))
    draft_logits_KV = 2.0 * jax.random.normal(jax.random.key(11), (2, V))
    sp = SamplingParams.make(0.8, 0, top_p)
    return logits_K1V, sampling.probs(draft_logits_KV, sp), sp


def _first_tokens(verify_fn, n, one_hot_q, top_p, seed=0):
    logits_K1V, q_KV, sp = _setting(top_p)
    k_draft, k_verify = jax.random.split(jax.random.key(seed))
    if one_hot_q:  # a deterministic drafter: always proposes the same tokens
        drafts = jnp.broadcast_to(jnp.argmax(q_KV, axis=-1), (n, 2)).astype(jnp.int32)
        q = None
    else:
        drafts = sampling.sample_from_probs(k_draft, jnp.broadcast_to(q_KV, (n, 2, V)))
        q = jnp.broadcast_to(q_KV, (n, 2, V))
    v = verify_fn(k_verify, jnp.broadcast_to(logits_K1V, (n, 3, V)), drafts, q, sp)
    p0 = np.asarray(sampling.probs(logits_K1V[:1], sp)[0], np.float64)
    return np.bincount(np.asarray(v.tokens_BK1[:, 0]), minlength=V), p0, np.asarray(v.num_accepted_B), q_KV, drafts


@pytest.mark.parametrize("one_hot_q", [False, True])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_first_emitted_token_follows_the_target(one_hot_q, top_p):
    n = 40000
    counts, p0, n_acc, q_KV, drafts = _first_tokens(verify.rejection_verify, n, one_hot_q, top_p)
    assert counts[p0 == 0].sum() == 0, "a token outside the target's top-p support was emitted"
    keep = p0 > 0
    assert _pvalue(counts[keep], p0[keep]) > 1e-3
    # acceptance of the first draft happens with probability sum_x min(p, q)
    q0 = np.asarray(q_KV[0], np.float64) if not one_hot_q else np.eye(V)[int(drafts[0, 0])]
    accept = np.minimum(p0, q0).sum()
    assert stats.binomtest(int((n_acc >= 1).sum()), n, accept).pvalue > 1e-3


@pytest.mark.parametrize("one_hot_q", [False, True])
def test_broken_residual_is_detected(monkeypatch, one_hot_q):
    """Sampling the correction from p instead of norm(max(0, p - q)) biases the output: the test sees it."""
    monkeypatch.setattr(verify, "residual_distribution", lambda p_BV, q_BV: p_BV)
    n = 40000
    counts, p0, _, _, _ = _first_tokens(verify.rejection_verify, n, one_hot_q, 1.0)
    keep = p0 > 0
    assert _pvalue(counts[keep], p0[keep]) < 1e-6


def test_residual_distribution():
    p = jnp.array([[0.5, 0.3, 0.2, 0.0]])
    q = jnp.array([[0.1, 0.6, 0.2, 0.1]])
    np.testing.assert_allclose(verify.residual_distribution(p, q), [[1.0, 0.0, 0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(verify.residual_distribution(p, p), p)  # zero mass: fall back to p
