"""EAGLE-3 and Medusa heads and their drafters on a tiny random target (CPU, fp32).

The drafter tests drive ``init/propose/update`` through cycles with arbitrary verification outcomes
(0..K drafts accepted, EOS-style cuts, finished rows) and check every proposal against a
from-scratch reference that recomputes the target's features for the whole context.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import cache as kv
from specjax import model, sampling
from specjax.generate import generate
from specjax.heads import eagle3, medusa
from specjax.sampling import SamplingParams
from specjax.speculative import loop, speculative_generate
from specjax.speculative.drafters.base import Context, Verified
from specjax.speculative.drafters.eagle3 import Eagle3
from specjax.speculative.drafters.medusa import Medusa
from training import tiny

K = 3


@pytest.fixture(scope="module")
def target():
    return tiny.target()


@pytest.fixture(scope="module")
def eagle(target):
    ecfg, dp = tiny.eagle3_head(*target)
    return Eagle3(ecfg), dp


@pytest.fixture(scope="module")
def heads(target):
    mcfg, mp = tiny.medusa_heads(target[0], num_heads=K)
    return Medusa(mcfg), mp


def test_default_taps_follow_specforge_and_vllm():
    assert eagle3.default_taps(30) == (2, 15, 27)  # outputs of layers 1, L//2-1, L-4
    assert eagle3.default_taps(32) == (2, 16, 29)
    with pytest.raises(ValueError, match="at least 4 layers"):
        eagle3.default_taps(3)


def test_eagle3_step_in_pieces_equals_one_shot(target, eagle):
    cfg, tp = target
    drafter, dp = eagle
    toks = jax.random.randint(jax.random.key(3), (2, 12), 0, cfg.vocab_size)
    g = jax.random.normal(jax.random.key(4), (2, 12, cfg.d_model))
    step = jax.jit(lambda t, h, c: eagle3.step(dp["params"], drafter.cfg, tp["embed"], t, h, c))
    one, _ = step(toks, g, eagle3.init_cache(drafter.cfg, 2, 32))
    cache, parts = eagle3.init_cache(drafter.cfg, 2, 32), []
    for a, b in [(0, 5), (5, 6), (6, 12)]:
        h, cache = step(toks[:, a:b], g[:, a:b], cache)
        parts.append(h)
    np.testing.assert_allclose(jnp.concatenate(parts, axis=1), one, rtol=1e-5, atol=1e-5)


W = 64  # contexts are right-padded to W tokens so the references compile once (causal: padding is unseen)


def _padded(context: list[int]) -> tuple[jax.Array, jax.Array]:
    return jnp.asarray([context + [0] * (W - len(context))]), jnp.int32(len(context) - 1)


@jax.jit
def _naive_eagle3_logits(tp, hp, ids, x_1W, L):
    """Greedy chain from scratch: target features for every position, head rows 0..L-1, K chained steps."""
    ecfg = eagle3.Eagle3Config(tiny.target_config(), draft_vocab_size=ids.shape[0])
    _, taps, _ = model.forward(tp, ecfg.target, x_1W[:, :-1], taps=ecfg.taps)
    h, cache = eagle3.step(hp, ecfg, tp["embed"], x_1W[:, 1:], eagle3.fuse(hp, taps), eagle3.init_cache(ecfg, 1, 2 * W))
    h = jax.lax.dynamic_slice_in_dim(h, L - 1, 1, axis=1)
    cache = kv.set_lengths(cache, L[None])
    out = []
    for _ in range(K):
        lg = eagle3.logits(hp, ecfg, h)[0, 0]
        out.append(lg)
        h, cache = eagle3.step(hp, ecfg, tp["embed"], ids[jnp.argmax(lg)][None, None], h, cache)
    return jnp.stack(out)


def naive_eagle3(tp, cfg, drafter, dp, context: list[int]) -> tuple[list[int], float]:
    """(greedy drafts, smallest top-1 margin along the chain)."""
    lg_KN = _naive_eagle3_logits(tp, dp["params"], dp["draft_ids"], *_padded(context))
    top2 = jax.lax.top_k(lg_KN, 2)[0]
    return [int(dp["draft_ids"][i]) for i in jnp.argmax(lg_KN, axis=-1)], float(jnp.min(top2[:, 0] - top2[:, 1]))


@jax.jit
def _naive_medusa_logits(tp, mp, x_1W, L):
    cfg = tiny.target_config()
    _, (h,), _ = model.forward(tp, cfg, x_1W, taps=(cfg.n_layers,))
    h_D = jax.lax.dynamic_index_in_dim(h[0], L - 1, keepdims=False)
    return medusa.logits(mp, medusa.MedusaConfig(cfg, num_heads=K), h_D, tp)


def naive_medusa(tp, cfg, drafter, dp, context: list[int]) -> tuple[list[int], float]:
    lg_KV = _naive_medusa_logits(tp, dp, *_padded(context))
    top2 = jax.lax.top_k(lg_KV, 2)[0]
    return [int(t) for t in jnp.argmax(lg_KV, axis=-1)], float(jnp.min(top2[:, 0] - top2[:, 1]))


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_drafter_state_matches_from_scratch_under_any_verdict(target, eagle, heads, kind):
    cfg, tp = target
    drafter, dp = eagle if kind == "eagle3" else heads
    naive = naive_eagle3 if kind == "eagle3" else naive_medusa
    rng = np.random.default_rng(5)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 200]]
    toks = np.zeros((2, 8), np.int32)
    for b, p in enumerate(prompts):
        toks[b, :len(p)] = p
    lens = jnp.asarray([len(p) for p in prompts], jnp.int32)
    sp = SamplingParams.make(0.0)
    state = loop.prefill(tp, dp, jnp.asarray(toks), lens, jnp.int32(40), sp, jax.random.key(0), cfg=cfg,
                         drafter=drafter, capacity=64, num_draft=K, eos_ids=())
    ds, cache, hist = state.draft, state.cache, np.array(state.history_BS)
    L, last = np.asarray(lens), np.asarray(state.last_B)
    propose = jax.jit(lambda ds, ctx, cache: drafter.propose(tp, dp, ds, ctx, cache, cfg))
    update = jax.jit(lambda ds, ver: drafter.update(tp, dp, ds, ver))
    forward = jax.jit(lambda fed, cache: model.forward(tp, cfg, fed, cache, taps=drafter.taps)[1:])
    verdicts = [(0, 1), (K, K + 1), (1, 1), (2, 3), (K, 0), (1, 2)]  # (accepted, emitted); emitted == accepted: cut
    for cycle, row_verdicts in enumerate(zip(verdicts, verdicts[2:] + verdicts[:2])):
        ctx = Context(jnp.asarray(hist), jnp.asarray(L), jnp.asarray(last), jax.random.key(cycle), sp, num_draft=K)
        prop, ds, cache = propose(ds, ctx, cache)
        drafts = np.asarray(prop.tokens_BK)
        for b in range(2):
            want, margin = naive(tp, cfg, drafter, dp, hist[b, :L[b] + 1].tolist())
            assert drafts[b].tolist() == want, (cycle, b, margin)
        fed = np.concatenate([last[:, None], drafts], axis=1)
        taps, cache = forward(jnp.asarray(fed), kv.set_lengths(cache, jnp.asarray(L)))
        n_acc, n_new = np.asarray(row_verdicts).T
        bonus = rng.integers(0, 256, 2)
        new_last = last.copy()
        for b in range(2):
            emitted = fed[b, 1:n_acc[b] + 1].tolist() + ([int(bonus[b])] if n_new[b] > n_acc[b] else [])
            emitted = emitted[:n_new[b]]
            hist[b, L[b] + 1:L[b] + 1 + len(emitted)] = emitted
            new_last[b] = emitted[-1] if emitted else last[b]
        ver = Verified(jnp.asarray(fed), taps, jnp.asarray(n_acc, jnp.int32), jnp.asarray(n_new, jnp.int32),
                       jnp.asarray(L + n_new, jnp.int32), jnp.asarray(new_last, jnp.int32))
        ds = update(ds, ver)
        L, last = L + n_new, new_last
        cache = kv.set_lengths(cache, jnp.asarray(L))


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_decoding_equals_ar_greedy(target, eagle, heads, kind):
    cfg, tp = target
    drafter, dp = eagle if kind == "eagle3" else heads
    prompts = [[5, 6, 7, 8, 9], [3, 4], list(range(10, 31))]
    free = generate(tp, cfg, prompts, max_new_tokens=24, eos_token_ids=())
    eos = free.output_ids[0][5]  # pretend a token of the first output is EOS: rows stop at different cycles
    ref = generate(tp, cfg, prompts, max_new_tokens=24, eos_token_ids=(eos,))
    out = speculative_generate(tp, cfg, prompts, drafter, dp, num_draft=K, max_new_tokens=24, eos_token_ids=(eos,))
    assert out.output_ids == ref.output_ids
    assert out.output_ids[0] == free.output_ids[0][:free.output_ids[0].index(eos) + 1]


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_sampled_drafts_come_with_the_distribution_they_were_drawn_from(target, eagle, heads, kind):
    cfg, tp = target
    drafter, dp = eagle if kind == "eagle3" else heads
    toks = jax.random.randint(jax.random.key(6), (2, 8), 0, 256)
    sp = SamplingParams.make(0.9, top_k=50)
    state = loop.prefill(tp, dp, toks, jnp.full((2,), 8, jnp.int32), jnp.int32(40), sp, jax.random.key(0), cfg=cfg,
                         drafter=drafter, capacity=64, num_draft=K, eos_ids=())  # same shapes as above: no recompile
    ctx = Context(state.history_BS, state.cache.lengths_B, state.last_B, jax.random.key(7), sp, num_draft=K)
    propose = jax.jit(lambda ds, ctx, cache: drafter.propose(tp, dp, ds, ctx, cache, cfg)[0])
    prop = propose(state.draft, ctx, state.cache)
    assert prop.q_BKV.shape == (2, K, cfg.vocab_size)
    q_at_draft = jnp.take_along_axis(prop.q_BKV, prop.tokens_BK[..., None], axis=-1)
    assert bool(jnp.all(q_at_draft > 0))
    np.testing.assert_allclose(jnp.sum(prop.q_BKV, axis=-1), 1.0, rtol=1e-5)
    if kind == "eagle3":  # d_1 from the stored head output; q is zero outside the draft vocabulary
        lg = eagle3.logits(dp["params"], drafter.cfg, state.draft["h_BD"][:, None])[:, 0]
        want = sampling.probs(eagle3.to_target_vocab(lg, dp["draft_ids"], cfg.vocab_size), sp)
        outside = jnp.ones(cfg.vocab_size, bool).at[dp["draft_ids"]].set(False)
        assert float(jnp.max(prop.q_BKV[..., outside])) == 0.0
    else:
        want = sampling.probs(medusa.logits(dp, drafter.cfg, state.draft, tp)[0], sp)
    np.testing.assert_allclose(prop.q_BKV[:, 0], want, rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct in float32, loaded once for the shipped-artifact tests (which only read it)."""
    from specjax import assets, pipeline
    if not (assets.home() / assets.MODELS["smollm2-135m-instruct"].dest).is_file():
        pytest.skip("SmolLM2 GGUF not fetched: run `specjax fetch`")
    return pipeline.load("smollm2-135m-instruct", "float32")


@pytest.mark.assets
@pytest.mark.parametrize("kind", ["eagle3", "medusa", "draft"])
def test_shipped_smollm2_artifacts_load_fit_and_decode_exactly(kind, smollm2):
    from specjax.heads import shipped
    from specjax.speculative.drafters.draft_model import DraftModel
    folder = shipped.ROOT / "smollm2-135m-instruct" / kind
    if not (folder / "config.json").is_file():
        pytest.skip(f"no shipped {kind} yet ({folder}): `python -m training.train_smollm2 --preset h100 --ship`")
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 25 * 2**20 and (folder / "CARD.md").is_file()
    lm = smollm2
    cfg, dp = shipped.load("smollm2-135m-instruct", kind, lm.cfg, lm.params)
    drafter = {"eagle3": Eagle3, "medusa": Medusa, "draft": DraftModel}[kind](cfg)
    ids = [lm.encode("Write a Python function that reverses a string.", chat=True)]
    ref = generate(lm.params, lm.cfg, ids, max_new_tokens=24)
    out = speculative_generate(lm.params, lm.cfg, ids, drafter, dp, num_draft=3, max_new_tokens=24)
    assert out.output_ids == ref.output_ids
    assert out.metrics()["mean_accepted"] > 1.0  # a trained drafter gets some drafts accepted on a plain prompt


NEW, PAST = 48, 7  # budget of the shipped EAGLE-3 replay checks, and the tokens past it a last cycle's verifier sees


@pytest.fixture(scope="module")
def eagle3_text(smollm2):
    """The shipped EAGLE-3 head and two chat prompts with the target's greedy text, NEW + PAST tokens (shared
    by the chain and tree checks below)."""
    from specjax.heads import shipped
    if not (shipped.ROOT / "smollm2-135m-instruct" / "eagle3" / "config.json").is_file():
        pytest.skip("no shipped eagle3 head")
    lm = smollm2
    ecfg, dp = shipped.load("smollm2-135m-instruct", "eagle3", lm.cfg, lm.params)
    ids = [lm.encode(t, chat=True) for t in ("Write a Python function that reverses a string.",
                                             "Explain why the sky is blue in three sentences.")]
    ref = generate(lm.params, lm.cfg, ids, max_new_tokens=NEW + PAST, eos_token_ids=()).output_ids
    return ecfg, dp, ids, ref


@pytest.mark.assets
def test_shipped_eagle3_loop_accepts_what_its_training_unroll_predicts(smollm2, eagle3_text):
    """Lossless decoding hides a drafter fed the wrong features (outputs stay exact, only acceptance
    drops). So: the loop's acceptance counts per draft position equal the chain replayed offline from
    the training-time unroll over the same greedy text (``chain_acceptance``); the text runs K tokens
    past the budget, as the verifier sees it. Exact in float32 here; one count of slack per position
    for a float near-tie between the unroll's attention and the cached step. A token/feature
    misalignment in the drafter's update costs ~1 in tau (checked by mutation: 1.24 vs 2.21)."""
    from training.eagle3_ttt import chain_acceptance, greedy_drafts
    lm, (ecfg, dp, ids, ref) = smollm2, eagle3_text
    K, new = PAST, NEW
    cyc, acc = 0, np.zeros(K, int)
    for p, out in zip(ids, ref):
        text = np.asarray(p + out, np.int32)  # K tokens past the budget: what the last cycle's verifier sees
        drafts = greedy_drafts(lm.params, ecfg, dp, text, K)
        c, a = chain_acceptance(drafts, text, len(p), len(p) + new)
        cyc, acc = cyc + c, acc + a
    res = speculative_generate(lm.params, lm.cfg, ids, Eagle3(ecfg), dp, num_draft=K, max_new_tokens=new,
                               eos_token_ids=())
    assert res.output_ids == [o[:new] for o in ref]
    assert 1 + acc.sum() / cyc > 1.5, acc  # the shipped head predicts something: the comparison is not vacuous
    assert res.stats.cycles_B.sum() == cyc
    loop_acc = res.stats.accepted_BK.sum(0)
    assert np.abs(loop_acc - acc).max() <= 1, (loop_acc.tolist(), acc.tolist())


@pytest.mark.assets
@pytest.mark.parametrize("size", [pytest.param(15, marks=pytest.mark.slow), 31])  # 15: the same code, -m slow
def test_shipped_eagle3_tree_accepts_what_its_training_unroll_ranks_predict(smollm2, eagle3_text, size):
    """Tree drafting, checked as the chain is above: along the accepted path a tree's node rows are the
    chain's rows, so the loop's acceptance with the head's fitted tree equals the replay from the ranks of
    the true tokens in the training unroll's steps (``tree_acceptance``), and its outputs equal AR greedy."""
    from specjax.heads import shipped
    from specjax.speculative.tree import Tree
    from training.eagle3_ttt import draft_ranks, tree_acceptance
    folder = shipped.ROOT / "smollm2-135m-instruct" / "eagle3"
    if not (folder / "trees.json").is_file():
        pytest.skip("no fitted trees beside the shipped eagle3 head")
    lm, (ecfg, dp, ids, ref) = smollm2, eagle3_text
    tree = Tree.load(folder / "trees.json", size, "eagle3")
    new = NEW
    assert tree.depth <= PAST  # the shared text runs PAST tokens past the budget
    cyc, acc = 0, np.zeros(tree.depth, int)
    for p, out in zip(ids, ref):
        c, a = tree_acceptance(draft_ranks(lm.params, ecfg, dp, np.asarray(p + out, np.int32), tree.depth),
                               tree.paths, len(p), len(p) + new)
        cyc, acc = cyc + c, acc + a
    res = speculative_generate(lm.params, lm.cfg, ids, Eagle3(ecfg, tree), dp, max_new_tokens=new, eos_token_ids=())
    assert res.output_ids == [o[:new] for o in ref]
    assert 1 + acc.sum() / cyc > 2.0, acc  # the fitted tree accepts more than a chain's first draft
    assert res.stats.cycles_B.sum() == cyc
    loop_acc = res.stats.accepted_BK.sum(0)
    assert np.abs(loop_acc - acc).max() <= 1, (loop_acc.tolist(), acc.tolist())


@pytest.mark.assets
@pytest.mark.parametrize("size", [pytest.param(15, marks=pytest.mark.slow), 31])  # 15: the same code, -m slow
def test_shipped_draft_model_tree_accepts_what_its_ranks_predict(smollm2, eagle3_text, size):
    """The shipped draft model drafting its fitted tree (``DraftModel(tree=...)``): along the accepted path it is fed
    the true tokens, so the loop's acceptance equals the replay from the true tokens' ranks in one teacher-forced
    forward of the draft model (``draft_model_ranks``). Acceptance fed by a stale draft cache (the accepted path's
    rows not moved) fails it; outputs equal AR greedy (float32)."""
    from specjax.heads import shipped
    from specjax.speculative.drafters.draft_model import DraftModel
    from specjax.speculative.tree import Tree
    from training.eagle3_ttt import draft_model_ranks, tree_acceptance
    folder = shipped.ROOT / "smollm2-135m-instruct" / "draft"
    if not (folder / "trees.json").is_file():
        pytest.skip("no fitted trees beside the shipped draft model")
    lm, (_, _, ids, ref) = smollm2, eagle3_text
    dcfg, dp = shipped.load("smollm2-135m-instruct", "draft", lm.cfg, lm.params)
    tree = Tree.load(folder / "trees.json", size, "draft")
    assert tree.depth <= PAST
    cyc, acc = 0, np.zeros(tree.depth, int)
    for p, out in zip(ids, ref):
        c, a = tree_acceptance(draft_model_ranks(dcfg, dp, np.asarray(p + out, np.int32), tree.depth), tree.paths,
                               len(p), len(p) + NEW)
        cyc, acc = cyc + c, acc + a
    res = speculative_generate(lm.params, lm.cfg, ids, DraftModel(dcfg, tree=tree), dp, max_new_tokens=NEW,
                               eos_token_ids=())
    assert res.output_ids == [o[:NEW] for o in ref]
    assert 1 + acc.sum() / cyc > 2.0, acc
    assert res.stats.cycles_B.sum() == cyc
    loop_acc = res.stats.accepted_BK.sum(0)
    assert np.abs(loop_acc - acc).max() <= 1, (loop_acc.tolist(), acc.tolist())
