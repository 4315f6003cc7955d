import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax import cache as kv
from specjax import config, model
from specjax.generate import _generate, generate
from specjax.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    cfg = config.tiny()
    return cfg, model.init_params(cfg, jax.random.key(0), scale=0.1)


_full_logits = jax.jit(lambda params, toks, cfg: model.forward(params, cfg, toks)[0][0], static_argnums=2)


def naive_greedy(params, cfg, prompt, n, width=48):
    """Greedy by a full forward per token, no cache. The sequence is right-padded to ``width`` so that
    one compilation serves every length (attention is causal: the padding cannot reach earlier rows)."""
    toks = list(prompt)
    for _ in range(n):
        logits = _full_logits(params, jnp.array([toks + [0] * (width - len(toks))]), cfg)
        toks.append(int(jnp.argmax(logits[len(toks) - 1])))
    return toks[len(prompt):]


def test_incremental_decoding_equals_full_forward(tiny):
    cfg, params = tiny
    toks = jax.random.randint(jax.random.key(1), (2, 19), 0, cfg.vocab_size)
    full, _, _ = model.forward(params, cfg, toks)
    cache = kv.init_cache(cfg, 2, 64)
    pieces = []
    for a, b in [(0, 7), (7, 8), (8, 12), (12, 19)]:
        logits, _, cache = model.forward(params, cfg, toks[:, a:b], cache)
        pieces.append(logits)
    inc = jnp.concatenate(pieces, axis=1)
    assert float(jnp.linalg.norm(inc - full) / jnp.linalg.norm(full)) < 1e-6


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_one_row_step_folds_the_norms_and_equals_full_forward(tiny, qkv_bias, monkeypatch):
    """B=1 decode steps (one row) take each RMSNorm's statistic from the next matmul's reduction
    (``layers.linear_sumsq``: attention and MLP norm, or the MLP norm only with a q/k/v bias); the logits
    equal a full forward's."""
    from specjax import layers
    cfg = dataclasses.replace(tiny[0], qkv_bias=qkv_bias)
    params = model.init_params(cfg, jax.random.key(3), scale=0.1)
    calls, original = [], layers.linear_sumsq
    counted = lambda *a, **k: calls.append(1) or original(*a, **k)
    monkeypatch.setattr(model, "linear_sumsq", counted)
    monkeypatch.setattr(layers, "linear_sumsq", counted)
    toks = jax.random.randint(jax.random.key(1), (1, 12), 0, cfg.vocab_size)
    full, _, _ = model.forward(params, cfg, toks)
    logits, _, cache = model.forward(params, cfg, toks[:, :8], kv.init_cache(cfg, 1, 32))
    assert not calls                                            # 8 rows: the norms run as before
    pieces = [logits]
    for t in range(8, 12):
        logits, _, cache = model.forward(params, cfg, toks[:, t:t + 1], cache)
        pieces.append(logits)
    assert len(calls) == 4 * cfg.n_layers * (1 if qkv_bias else 2)
    inc = jnp.concatenate(pieces, axis=1)
    assert float(jnp.linalg.norm(inc - full) / jnp.linalg.norm(full)) < 1e-6


def test_fold_norm_rule():
    """Folded: one row, compute_dtype "param", model width <= layers.FOLD_MAX_IN (2048); else not."""
    from specjax.layers import fold_norm
    x, w = lambda B, D: jnp.zeros((B, 1, D)), lambda D: jax.ShapeDtypeStruct((8, D), jnp.bfloat16)
    assert fold_norm(x(1, 576), w(576)) and fold_norm(x(1, 2048), w(2048))
    assert not fold_norm(x(1, 4096), w(4096))                      # the 8B width: slower folded
    assert not fold_norm(x(2, 576), w(576)) and not fold_norm(x(1, 576), w(576), "float32")


def test_greedy_equals_naive_and_batch_equals_alone(tiny):
    cfg, params = tiny
    prompts = [[5, 6, 7, 8, 9], [3, 4], list(range(10, 31))]
    batch = generate(params, cfg, prompts, max_new_tokens=10, eos_token_ids=())
    for i, p in enumerate(prompts):
        alone = generate(params, cfg, [p], max_new_tokens=10, eos_token_ids=())
        assert alone.output_ids[0] == batch.output_ids[i]
        assert batch.output_ids[i] == naive_greedy(params, cfg, p, 10)


def test_eos_stops_each_sequence(tiny):
    cfg, params = tiny
    prompts = [[5, 6, 7, 8, 9], [3, 4]]
    free = generate(params, cfg, prompts, max_new_tokens=8, eos_token_ids=())
    eos = free.output_ids[0][2]  # pretend the third token of prompt 0 is EOS
    out = generate(params, cfg, prompts, max_new_tokens=8, eos_token_ids=(eos,))
    for got, ref in zip(out.output_ids, free.output_ids):
        stop = ref.index(eos) + 1 if eos in ref else len(ref)  # EOS included, nothing after it
        assert got == ref[:stop]
    assert len(out.output_ids[0]) <= 3


@pytest.mark.parametrize("unroll,temperature", [(2, 0.0), (3, 0.0), (3, 0.9)])
def test_unrolled_loop_equals_one_step_per_iteration(tiny, unroll, temperature):
    """Steps past a sequence's end (EOS or budget) inside an unrolled iteration change nothing; sampling
    draws the same keys (one split per step)."""
    cfg, params = tiny
    toks, lens = jnp.array([[5, 6, 7, 8, 9], [3, 4, 0, 0, 0]], jnp.int32), jnp.array([5, 2])
    free = generate(params, cfg, [[5, 6, 7, 8, 9], [3, 4]], max_new_tokens=8, eos_token_ids=(),
                    temperature=temperature, unroll=1).output_ids
    for max_new, eos in [(8, ()), (7, (free[0][2],)), (1, ())]:
        args = (params, toks, lens, jnp.int32(max_new), SamplingParams.make(temperature), jax.random.key(0))
        ref = _generate(*args, cfg=cfg, capacity=16, eos_ids=eos)
        got = _generate(*args, cfg=cfg, capacity=16, eos_ids=eos, unroll=unroll)
        np.testing.assert_array_equal(got[1], ref[1])
        for b in range(2):
            np.testing.assert_array_equal(got[0][b, :int(ref[1][b])], ref[0][b, :int(ref[1][b])])
    assert int(ref[1][0]) == 1  # the last case: one token, inside the prefill


def test_max_new_tokens_is_traced_and_respected(tiny):
    cfg, params = tiny
    a = generate(params, cfg, [[1, 2, 3]], max_new_tokens=5, eos_token_ids=())
    b = generate(params, cfg, [[1, 2, 3]], max_new_tokens=9, eos_token_ids=())
    assert len(a.output_ids[0]) == 5 and len(b.output_ids[0]) == 9
    assert b.output_ids[0][:5] == a.output_ids[0]


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.8), dict(temperature=0.8, top_k=5, top_p=0.9)])
def test_decode_loop_has_no_per_step_cond(tiny, sampling):
    """Greedy vs sampling and the top-k/top-p filter are fixed on the host: the lax.cond that chose greedy
    per step cost 40 us per step on an H200 (benchmarks/NOTES.md item 18)."""
    cfg, params = tiny
    jaxpr = jax.make_jaxpr(lambda sp: _generate(params, jnp.ones((1, 4), jnp.int32), jnp.array([4]), jnp.int32(5),
                                                sp, jax.random.key(0), cfg=cfg, capacity=16, eos_ids=(2,)))
    text = str(jaxpr(SamplingParams.make(**sampling)))
    assert "while[" in text and "cond[" not in text


def test_fixed_seed_reproduces(tiny):
    cfg, params = tiny
    kw = dict(max_new_tokens=12, temperature=1.0, top_p=0.9, eos_token_ids=())
    a = generate(params, cfg, [[1, 2, 3], [4, 5]], seed=7, **kw)
    b = generate(params, cfg, [[1, 2, 3], [4, 5]], seed=7, **kw)
    c = generate(params, cfg, [[1, 2, 3], [4, 5]], seed=8, **kw)
    assert a.output_ids == b.output_ids and a.output_ids != c.output_ids


def _first_token_counts(params, cfg, prompt, n, **kw):
    res = generate(params, cfg, [prompt] * n, max_new_tokens=1, eos_token_ids=(), **kw)
    return np.bincount([o[0] for o in res.output_ids], minlength=cfg.vocab_size)


@pytest.mark.parametrize("temperature", [1.0])
def test_sampled_frequencies_match_softmax(temperature):
    cfg = config.tiny(vocab_size=24)
    params = model.init_params(cfg, jax.random.key(3), scale=0.3)
    prompt = [1, 5, 9]
    logits, _, _ = model.forward(params, cfg, jnp.array([prompt]))
    p = np.asarray(jax.nn.softmax(logits[0, -1] / temperature), np.float64)
    p = p / p.sum()
    counts = _first_token_counts(params, cfg, prompt, 6000, temperature=temperature, seed=11)
    assert stats.chisquare(counts, p * counts.sum()).pvalue > 1e-3
    # the test has power: sampling at the wrong temperature is rejected
    wrong = _first_token_counts(params, cfg, prompt, 6000, temperature=0.6, seed=11)
    assert stats.chisquare(wrong, p * wrong.sum()).pvalue < 1e-6


@pytest.mark.parametrize("kw, msg", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(unroll=0), "unroll"),
])
def test_bad_arguments(tiny, kw, msg):
    cfg, params = tiny
    with pytest.raises(ValueError, match=msg):
        generate(params, cfg, [[1, 2]], **kw)


def test_bad_prompts(tiny):
    cfg, params = tiny
    with pytest.raises(ValueError, match="empty"):
        generate(params, cfg, [[]])
    with pytest.raises(ValueError, match="context"):
        generate(params, cfg, [[1] * cfg.max_seq_len], max_new_tokens=4)
