"""Losslessness at T > 0: the joint distribution of the first tokens that speculative decoding
emits equals the target's exact distribution (enumerated from the model), for every drafter (the draft model
also with a restricted draft vocabulary, whose q is zero on the tokens it leaves out, and with an adaptive
chain that stops after a draft below ``min_confidence``), and for a draft tree (5 nodes of depth 2, drafted by
Medusa heads and by the draft model: the tree forward and the sampled tree verification).

Setting: a tiny model with 16 tokens, top-p 0.9, K = 2. At T = 0.7 the first 4 tokens are tested
(prefill token, then a cycle's two drafts and, after full acceptance, its bonus), at T = 1.0 the
first 3. Pearson chi-square over the outcomes (outcomes with expected count < 5 pooled), level
ALPHA. Sample size: a sampler whose output is at total-variation distance >= TV from the exact
distribution has chi-square divergence >= 4 TV^2 (Cauchy-Schwarz), so the statistic is noncentral
chi-square with lambda >= 4 TV^2 N; N is the smallest multiple of 4096 with power >= POWER at both
temperatures (computed below, about 50k). One batch of N identical prompts per run: rows draw
independent randomness, so this is N independent samples from one compile.
"""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax import config, model, sampling
from specjax.heads import medusa
from specjax.speculative import DraftModel, LayerSkip, NGram, speculative_generate, verify
from specjax.speculative.drafters.draft_model import restrict_vocab
from specjax.speculative.drafters.medusa import Medusa
from specjax.speculative.tree import Tree

TV, ALPHA, POWER = 0.02, 1e-3, 0.99
TOKENS = {0.7: 4, 1.0: 3}  # temperature -> first tokens whose joint distribution is tested
TOP_P, K = 0.9, 2
PROMPT = [1, 10, 12, 8, 10, 12, 8, 10, 12]  # [1] + the first 3 greedy tokens, repeated: n-gram hits
MEDUSA_TREE = Tree(((0,), (1,), (2,), (0, 0), (1, 0)))  # depth 2 like K; siblings tried in rank order
ADAPTIVE = 0.3  # min_confidence of "draft-adaptive": some cycles stop after d_1, the others draft both


def _models():
    cfg = config.tiny(vocab_size=16, d_model=32, ffn_dim=64, eos_token_ids=(), bos_token_id=None)
    params = model.init_params(cfg, jax.random.key(3), scale=0.6)
    for name in ("wo", "w_down"):  # damp the last layer so an early exit after layer 1 is often accepted
        params["layers"][1][name] = 0.3 * params["layers"][1][name]
    noise = model.init_params(cfg, jax.random.key(9), scale=0.09)
    perturb = lambda w, e: w + e if w.ndim == 2 else w  # noqa: E731  (matrices only; norms stay)
    return cfg, params, jax.tree.map(perturb, params, noise)  # draft model: a perturbed copy of the target


def exact_joint(params, cfg, temperature: float, m: int) -> dict[tuple, float]:
    """P(first m tokens), enumerated: one forward over every prompt + (m-1)-token continuation gives
    p(x_i | x_<i) for all prefixes at once; the joint is their product (sampling.probs: T, top-p)."""
    sp = sampling.SamplingParams.make(temperature, 0, TOP_P)
    V, P = cfg.vocab_size, len(PROMPT)
    grid = np.array(list(itertools.product(range(V), repeat=m - 1)), np.int32).reshape(-1, m - 1)
    logits, _, _ = model.forward(params, cfg, jnp.asarray(np.hstack([np.tile(PROMPT, (len(grid), 1)), grid])))
    p = np.asarray(sampling.probs(logits[:, P - 1:], sp), np.float64)  # [N, m, V]
    prefix = np.prod(np.take_along_axis(p[:, :-1], grid[:, :, None], axis=2)[..., 0], axis=1)
    joint = prefix[:, None] * p[:, -1]  # [N, V]
    return {tuple(grid[i]) + (int(t),): float(joint[i, t]) for i, t in zip(*np.nonzero(joint))}


def _cells(exact: dict, n: int) -> list[tuple]:
    return [k for k, v in exact.items() if v * n >= 5]


def required_samples(exact: dict) -> int:
    n = 4096
    while True:
        df = len(_cells(exact, n))  # big cells + the pooled rest, minus one
        crit = stats.chi2.isf(ALPHA, df)
        if stats.ncx2.sf(crit, df, 4 * TV * TV * n) >= POWER:
            return n
        n += 4096


def chi2_pvalue(outputs: list[list[int]], exact: dict) -> float:
    n = len(outputs)
    counts = collections.Counter(tuple(o) for o in outputs)
    outside = sum(c for k, c in counts.items() if k not in exact)
    assert outside == 0, f"{outside} samples outside the target's top-p support"
    cells = _cells(exact, n)
    obs = np.array([counts[k] for k in cells] + [n - sum(counts[k] for k in cells)], np.float64)
    exp = np.array([exact[k] for k in cells] + [max(1.0 - sum(exact[k] for k in cells), 0.0)]) * n
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()
    return float(stats.chi2.sf(np.sum((obs - exp) ** 2 / exp), len(obs) - 1))


@pytest.fixture(scope="module")
def setting():
    cfg, params, dparams = _models()
    exact = {t: exact_joint(params, cfg, t, m) for t, m in TOKENS.items()}
    n = max(required_samples(e) for e in exact.values())
    assert n <= 65536, f"the test needs {n} samples per run; retune the model to keep CI fast"
    mcfg = medusa.MedusaConfig(cfg, num_heads=2)
    heads = jax.tree.map(lambda x: 0.3 * jax.random.normal(jax.random.key(4), x.shape), medusa.init_params(mcfg))
    rcfg, rdp = restrict_vocab(cfg, dparams, [15, 3, 12, 7, 10, 5, 8, 11, 4, 13, 6, 9])  # 12 of the 16 tokens
    drafters = {"draft": (DraftModel(cfg), dparams), "layerskip": (LayerSkip(1), None), "ngram": (NGram(1, 2), None),
                "medusa-tree": (Medusa(mcfg, MEDUSA_TREE), heads), "draft-vocab": (DraftModel(rcfg), rdp),
                "draft-adaptive": (DraftModel(cfg, min_confidence=ADAPTIVE), dparams),
                "draft-tree": (DraftModel(cfg, tree=MEDUSA_TREE), dparams)}
    return cfg, params, drafters, exact, n


def _sample(setting, method, temperature, seed):
    cfg, params, drafters, _, n = setting
    drafter, dp = drafters[method]
    res = speculative_generate(params, cfg, [PROMPT] * n, drafter, dp, num_draft=None if drafter.tree else K,
                               max_new_tokens=TOKENS[temperature], temperature=temperature, top_p=TOP_P, seed=seed,
                               capacity=16 if drafter.tree is None else 32)
    return res.output_ids, res.metrics()


@pytest.mark.parametrize("method", ["draft", "layerskip", "ngram", "medusa-tree", "draft-vocab", "draft-adaptive",
                                    "draft-tree"])
def test_speculative_sampling_is_lossless(setting, method):
    for temperature in TOKENS:
        outputs, m = _sample(setting, method, temperature, seed=1)
        assert m["acceptance_per_position"][0] > 0.05, "the drafter is never accepted: the test would not exercise it"
        if method == "draft-adaptive":  # both kinds of cycle occur: stopped after d_1, and a full chain
            assert 1.1 < m["mean_drafted"] < K - 0.1, m["mean_drafted"]
        assert chi2_pvalue(outputs, setting[3][temperature]) > ALPHA


def test_a_broken_verifier_fails_the_test(setting, monkeypatch):
    """Drawing the correction from p instead of norm(max(0, p - q)) must be caught (the one-hot-q case
    is covered at the verifier level in test_verify.py)."""
    try:
        with monkeypatch.context() as patch:
            patch.setattr(verify, "residual_distribution", lambda p_BV, q_BV: p_BV)
            jax.clear_caches()  # retrace the loop with the broken verifier
            outputs, _ = _sample(setting, "draft", 1.0, seed=1)
        assert chi2_pvalue(outputs, setting[3][1.0]) < ALPHA
    finally:
        jax.clear_caches()  # drop the broken traces


def test_accepting_past_an_early_stop_fails_the_test(setting, monkeypatch):
    """A verifier that ignores where an adaptive chain stopped (accepting its padding slot, whose q is 0) must be
    caught."""
    try:
        with monkeypatch.context() as patch:
            patch.setattr(verify, "drafted", lambda draft_BK, num_drafts_B: jnp.ones(draft_BK.shape, bool))
            jax.clear_caches()
            outputs, _ = _sample(setting, "draft-adaptive", 1.0, seed=1)
        assert chi2_pvalue(outputs, setting[3][1.0]) < ALPHA
    finally:
        jax.clear_caches()
