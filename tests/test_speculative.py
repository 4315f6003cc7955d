"""The speculative loop on tiny random models: greedy identity with AR, ragged batches, EOS and
budget cuts inside a cycle, the capacity guard, seeds, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import config, model
from specjax.errors import AssetsMissing
from specjax.generate import generate
from specjax.sampling import SamplingParams
from specjax.speculative import DraftModel, LayerSkip, NGram, loop, run, speculative_generate
from specjax.speculative.drafters.draft_model import restrict_vocab

# mixed lengths, some repetitive (n-gram hits); MAX_NEW is not a multiple of K+1 (budget cuts a cycle)
PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [3, 4], [9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9], list(range(11, 20))]
MAX_NEW = 13


@pytest.fixture(scope="module")
def tiny():
    cfg = config.tiny()
    dcfg = config.tiny(n_layers=1)
    params = model.init_params(cfg, jax.random.key(0), scale=0.1)
    return cfg, params, dcfg, model.init_params(dcfg, jax.random.key(5), scale=0.1)


@pytest.fixture(scope="module")
def ar(tiny):
    cfg, params, _, _ = tiny
    return generate(params, cfg, PROMPTS, max_new_tokens=MAX_NEW, eos_token_ids=()).output_ids


def _drafter(tiny, method):
    cfg, params, dcfg, dparams = tiny
    return {"ngram": (NGram(1, 3), None), "layerskip": (LayerSkip(1), None), "draft": (DraftModel(dcfg), dparams),
            "self-draft": (DraftModel(cfg), params), "full-layerskip": (LayerSkip(cfg.n_layers), None)}[method]


def _counters_consistent(res, K):
    for n, c, a in zip(res.new_tokens, res.stats.cycles_B, res.stats.accepted_BK.sum(axis=1)):
        assert c <= n - 1 <= c + a  # every cycle emits >= 1 token, at most accepted + 1
    assert res.stats.accepted_BK.shape == (len(res.output_ids), K)


@pytest.mark.parametrize("method, K", [("ngram", 4), ("layerskip", 3), ("draft", 1), ("draft", 3)])
def test_greedy_equals_autoregressive(tiny, ar, method, K):
    cfg, params, _, _ = tiny
    drafter, dp = _drafter(tiny, method)
    res = speculative_generate(params, cfg, PROMPTS, drafter, dp, num_draft=K, max_new_tokens=MAX_NEW,
                               eos_token_ids=())
    assert res.output_ids == ar
    _counters_consistent(res, K)
    m = res.metrics()
    assert m["method"] == method and len(m["acceptance_per_position"]) == K
    assert m["num_cycles"] == res.stats.cycles_B.sum()


def test_budgets_shorter_than_a_cycle(tiny, ar):
    cfg, params, _, _ = tiny
    for n in (1, 2, 5):  # 1: the prefill token alone, no cycle; 2, 5: the budget cuts a cycle of up to 5 tokens
        res = speculative_generate(params, cfg, PROMPTS, NGram(1, 3), num_draft=4, max_new_tokens=n, eos_token_ids=())
        assert res.output_ids == [o[:n] for o in ar]


def test_batch_equals_each_prompt_alone(tiny):
    cfg, params, _, _ = tiny
    drafter, dp = _drafter(tiny, "draft")
    kw = dict(num_draft=3, max_new_tokens=MAX_NEW, eos_token_ids=())
    batch = speculative_generate(params, cfg, PROMPTS, drafter, dp, **kw)
    for i, p in enumerate(PROMPTS):
        alone = speculative_generate(params, cfg, [p], drafter, dp, **kw)
        assert alone.output_ids[0] == batch.output_ids[i]


@pytest.mark.parametrize("method", ["self-draft", "full-layerskip"])
def test_a_drafter_equal_to_the_target_is_always_accepted(tiny, ar, method):
    """The target as its own draft model, or layerskip through all layers (sharing the target's cache)."""
    cfg, params, _, _ = tiny
    drafter, dp = _drafter(tiny, method)
    res = speculative_generate(params, cfg, PROMPTS, drafter, dp, num_draft=3, max_new_tokens=MAX_NEW,
                               eos_token_ids=())
    assert res.output_ids == ar
    m = res.metrics()
    assert m["acceptance_per_position"] == [1.0, 1.0, 1.0] and m["mean_accepted"] == 4.0
    assert res.stats.cycles_B.tolist() == [-(-(MAX_NEW - 1) // 4)] * len(PROMPTS)  # ceil(12 / 4) cycles each


def _cycles_of_a_restricted_self_draft(ar_row, allowed, K):
    """Cycles the target drafting for itself from ``allowed`` tokens only takes: a draft is the target's own greedy
    token while that lies in ``allowed``; the first one outside is missed and the target's correction ends the cycle."""
    pos, cycles = 1, 0  # token 0 comes from the prefill
    while pos < len(ar_row):
        run = 0
        while run < K and pos + run < len(ar_row) and ar_row[pos + run] in allowed:
            run += 1
        pos, cycles = pos + run + 1, cycles + 1
    return cycles


def test_restricted_draft_vocabulary_maps_head_rows_back_to_tokens(tiny, ar):
    """``restrict_vocab``: the target as its own draft over a permutation of every token is always accepted (so head
    row i proposes token ids[i]); over half the tokens it drafts only those, as the cycle count shows, and stays
    exact."""
    cfg, params, _, _ = tiny
    perm = np.random.default_rng(0).permutation(cfg.vocab_size)
    kw = dict(num_draft=3, max_new_tokens=MAX_NEW, eos_token_ids=())
    pcfg, pdp = restrict_vocab(cfg, params, perm)
    res = speculative_generate(params, cfg, PROMPTS, DraftModel(pcfg), pdp, **kw)
    assert res.output_ids == ar and res.metrics()["mean_accepted"] == 4.0
    half = perm[: cfg.vocab_size // 2]
    rcfg, rdp = restrict_vocab(cfg, params, half)
    assert rdp["lm_head"].shape == (len(half), cfg.d_model) and not rcfg.tie_embeddings
    res = speculative_generate(params, cfg, PROMPTS, DraftModel(rcfg), rdp, **kw)
    assert res.output_ids == ar
    want = [_cycles_of_a_restricted_self_draft(row, set(half.tolist()), 3) for row in ar]
    assert res.stats.cycles_B.tolist() == want and want != [-(-(MAX_NEW - 1) // 4)] * len(PROMPTS)


def test_adaptive_draft_length_stays_exact(tiny, ar):
    """``DraftModel(min_confidence=c)``: a row stops drafting after a draft below probability c. The target as its
    own draft is always accepted, so every proposed draft is accepted; c = 0.025 splits this model's greedy
    probabilities (0.014-0.047) about in half, so chains stop early and run on. A c no probability falls under
    proposes K per cycle and reproduces the fixed chain's counters."""
    cfg, params, dcfg, dparams = tiny
    K, kw = 4, dict(num_draft=4, max_new_tokens=MAX_NEW, eos_token_ids=())
    res = speculative_generate(params, cfg, PROMPTS, DraftModel(cfg, min_confidence=0.025), params, **kw)
    assert res.output_ids == ar
    drafted, cycles = res.stats.drafted_B, res.stats.cycles_B
    assert (res.stats.accepted_BK.sum(axis=1) == drafted).all()
    assert (cycles < drafted).any() and (drafted < K * cycles).all()
    m = res.metrics()
    assert m["num_drafted"] == drafted.sum() and 1 < m["mean_drafted"] < K and m["draft_acceptance_rate"] == 1.0
    fixed = speculative_generate(params, cfg, PROMPTS, DraftModel(dcfg), dparams, **kw)
    never = speculative_generate(params, cfg, PROMPTS, DraftModel(dcfg, min_confidence=1e-9), dparams, **kw)
    assert never.output_ids == fixed.output_ids == ar
    for a, b in [(never.stats.cycles_B, fixed.stats.cycles_B), (never.stats.accepted_BK, fixed.stats.accepted_BK),
                 (never.stats.drafted_B, K * fixed.stats.cycles_B), (fixed.stats.drafted_B, K * fixed.stats.cycles_B)]:
        assert (a == b).all()
    one = speculative_generate(params, cfg, PROMPTS, DraftModel(dcfg, min_confidence=0.9), dparams, **kw)
    assert one.output_ids == ar and (one.stats.drafted_B == one.stats.cycles_B).all()  # each stops after d_1
    assert not one.stats.accepted_BK[:, 1:].any()
    for bad in (1.0, -0.1, "0.5", True):
        with pytest.raises(ValueError, match="min_confidence"):
            speculative_generate(params, cfg, PROMPTS, DraftModel(dcfg, min_confidence=bad), dparams, **kw)


def test_restrict_vocab_rejects_bad_ids(tiny):
    cfg, params, _, _ = tiny
    V = cfg.vocab_size
    for ids, match in [([], "non-empty"), ([[1, 2]], "1-D"), ([0.5], "token ids"), ([1, 1], "1 repeated"),
                       ([V], f"in \\[0, {V}\\)"), ([-1], "distinct")]:
        with pytest.raises(ValueError, match=match):
            restrict_vocab(cfg, params, np.asarray(ids))
    with pytest.raises(ValueError, match="untied LM head of one row per id"):
        DraftModel(cfg).validate(cfg, params | {"vocab_ids": jnp.arange(4)}, 2)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_eos_stops_each_sequence_inside_a_cycle(tiny, ar, method):
    cfg, params, _, _ = tiny
    cut = next(i for i, t in enumerate(ar[0]) if i >= 3 and t not in ar[0][:i])
    eos = ar[0][cut]  # pretend a token first emitted mid-way through prompt 0's output is EOS
    want = generate(params, cfg, PROMPTS, max_new_tokens=MAX_NEW, eos_token_ids=(eos,)).output_ids
    assert want[0] == ar[0][:cut + 1]
    drafter, dp = _drafter(tiny, method)
    res = speculative_generate(params, cfg, PROMPTS, drafter, dp, num_draft=3, max_new_tokens=MAX_NEW,
                               eos_token_ids=(eos,))
    assert res.output_ids == want


def test_capacity_guard_inside_the_jit(tiny, ar):
    """Called directly with too small a cache, the loop shortens the budget instead of clamping writes."""
    cfg, params, _, _ = tiny
    K, capacity = 3, 20
    toks = jnp.array([PROMPTS[1] + [0] * 14], jnp.int32)
    sp = SamplingParams.make()
    kw = dict(cfg=cfg, drafter=NGram(1, 3), eos_ids=())
    state = loop.prefill(params, None, toks, jnp.array([2]), jnp.int32(100), sp, jax.random.key(0),
                         capacity=capacity, num_draft=K, **kw)
    assert int(state.budget_B[0]) == capacity - K - 1 - 2
    state = loop.decode(params, None, state, sp, **kw)
    out = loop.outputs(state, [2])[0]
    assert out == generate(params, cfg, [PROMPTS[1]], max_new_tokens=len(out), eos_token_ids=()).output_ids[0]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_cycle_has_no_per_step_cond(tiny, temperature):
    """As for AR (tests/test_generate.py): no lax.cond inside the speculative while loop."""
    cfg, params, dcfg, dparams = tiny
    sp = SamplingParams.make(temperature, top_p=0.9)
    kw = dict(cfg=cfg, drafter=DraftModel(dcfg), eos_ids=(2,))
    state = loop.prefill(params, dparams, jnp.array([[5, 6, 7, 0]], jnp.int32), jnp.array([3]), jnp.int32(8), sp,
                         jax.random.key(0), capacity=32, num_draft=3, **kw)
    text = str(jax.make_jaxpr(lambda s: loop.decode(params, dparams, s, sp, **kw))(state))
    assert "while[" in text and "cond[" not in text


def test_fixed_seed_reproduces(tiny):
    cfg, params, _, _ = tiny
    kw = dict(num_draft=3, max_new_tokens=MAX_NEW, temperature=1.0, top_p=0.9, eos_token_ids=())
    a = speculative_generate(params, cfg, PROMPTS, NGram(1, 3), seed=7, **kw)
    b = speculative_generate(params, cfg, PROMPTS, NGram(1, 3), seed=7, **kw)
    c = speculative_generate(params, cfg, PROMPTS, NGram(1, 3), seed=8, **kw)
    assert a.output_ids == b.output_ids and a.output_ids != c.output_ids


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_program_equals_prefill_then_decode(tiny, temperature):
    """The default (prefill and loop in one program) and ``ttft=True`` (two programs, TTFT timed) run the same
    computation: same tokens and counters, greedy and sampled; only the second reports a TTFT."""
    cfg, params, dcfg, dparams = tiny
    kw = dict(num_draft=3, max_new_tokens=MAX_NEW, temperature=temperature, top_p=0.9, eos_token_ids=(2,), seed=3)
    one = speculative_generate(params, cfg, PROMPTS, DraftModel(dcfg), dparams, **kw)
    two = speculative_generate(params, cfg, PROMPTS, DraftModel(dcfg), dparams, ttft=True, **kw)
    assert one.output_ids == two.output_ids
    for a, b in [(one.stats.cycles_B, two.stats.cycles_B), (one.stats.accepted_BK, two.stats.accepted_BK),
                 (one.stats.new_tokens_B, two.stats.new_tokens_B)]:
        assert (a == b).all()
    assert one.ttft_s is None and one.metrics()["itl_s"] is None
    assert 0 < two.ttft_s < two.seconds and two.metrics()["itl_s"] > 0
    with pytest.raises(ValueError, match="ttft must be True or False"):
        speculative_generate(params, cfg, PROMPTS, NGram(), ttft="yes")


@pytest.mark.parametrize("K", [0, -1, 33, 2.5, True])
def test_bad_num_draft(tiny, K):
    cfg, params, _, _ = tiny
    with pytest.raises(ValueError, match="num_draft"):
        speculative_generate(params, cfg, PROMPTS, NGram(), num_draft=K)
    with pytest.raises(ValueError, match="num_draft"):
        run(params, cfg, PROMPTS, method="ngram", num_draft=K)


def test_bad_drafters_and_options(tiny):
    cfg, params, _, _ = tiny
    small = config.tiny(vocab_size=128)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(params, cfg, PROMPTS, DraftModel(small), model.init_params(small, jax.random.key(1)))
    with pytest.raises(ValueError, match="vocabulary"):
        run(params, cfg, PROMPTS, method="draft", num_draft=2,
            draft_model=(small, model.init_params(small, jax.random.key(1))))
    with pytest.raises(ValueError, match="unknown speculative method 'medusa2'"):
        run(params, cfg, PROMPTS, method="medusa2", num_draft=2)
    with pytest.raises((ValueError, AssetsMissing), match="shipped draft model is made for|no shipped draft"):
        run(params, cfg, PROMPTS, method="draft", num_draft=2)  # the default is SmolLM2's shipped draft model
    with pytest.raises(ValueError, match="exit layer"):
        speculative_generate(params, cfg, PROMPTS, LayerSkip(cfg.n_layers + 1))
    with pytest.raises(ValueError, match="n-gram sizes"):
        speculative_generate(params, cfg, PROMPTS, NGram(3, 2))
    with pytest.raises(ValueError, match="capacity 16 is too small"):
        speculative_generate(params, cfg, PROMPTS, NGram(), num_draft=4, max_new_tokens=MAX_NEW, capacity=16)
    with pytest.raises(ValueError, match="must be a specjax"):
        speculative_generate(params, cfg, PROMPTS, "ngram")
