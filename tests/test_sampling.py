import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.sampling import SamplingParams, probs, sample


def numpy_reference(logits, temperature, top_k, top_p):
    x = logits.astype(np.float64) / temperature
    order = np.argsort(-x)
    keep = np.zeros_like(x, bool)
    k = top_k if top_k > 0 else len(x)
    p = np.exp(x[order[:k]] - x[order[0]])
    p /= p.sum()
    before = np.cumsum(p) - p
    keep[order[:k][before < top_p]] = True
    out = np.where(keep, np.exp(x - x.max()), 0.0)
    return out / out.sum()


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.0, 5, 1.0),
                                                        (1.3, 7, 0.5), (0.5, 0, 0.3)])
def test_probs_match_numpy(temperature, top_k, top_p):
    logits = np.asarray(jax.random.normal(jax.random.key(0), (3, 50))) * 3
    got = np.asarray(probs(jnp.asarray(logits), SamplingParams.make(temperature, top_k, top_p)))
    for row, g in zip(logits, got):
        np.testing.assert_allclose(g, numpy_reference(row, temperature, top_k, top_p), atol=1e-6)


def test_greedy_is_one_hot_argmax():
    logits = jax.random.normal(jax.random.key(1), (4, 30))
    p = probs(logits, SamplingParams.make(0.0))
    assert jnp.all(jnp.argmax(p, -1) == jnp.argmax(logits, -1)) and jnp.all(p.sum(-1) == 1)
    assert jnp.all(sample(jax.random.key(2), logits, SamplingParams.make(0.0)) == jnp.argmax(logits, -1))


def test_sample_stays_inside_the_filtered_support():
    logits = jax.random.normal(jax.random.key(3), (2000, 40)) * 2
    sp = SamplingParams.make(1.0, 3, 1.0)
    toks = sample(jax.random.key(4), logits, sp)
    top3 = jnp.argsort(-logits, axis=-1)[:, :3]
    assert bool(jnp.all(jnp.any(top3 == toks[:, None], axis=-1)))


@pytest.mark.parametrize("kw", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.01), dict(top_k=-1)])
def test_invalid_params(kw):
    with pytest.raises(ValueError):
        SamplingParams.make(**kw)
