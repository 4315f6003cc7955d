"""Drafters in isolation: n-gram lookup rules, layerskip's shared cache and exit heads, draft-model
and option validation, and ``draw``."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import cache as kv
from specjax import config, model, sampling
from specjax.generate import generate
from specjax.sampling import SamplingParams
from specjax.speculative import DraftModel, LayerSkip, NGram, drafters, speculative_generate
from specjax.speculative.drafters.base import Context, draw
from specjax.speculative.tree import Tree


def _propose_ngram(rows, K, **kw):
    """Proposals for histories given as token lists (the last token of each is ``last``)."""
    S = 32
    hist = np.full((len(rows), S), 99, np.int32)  # 99 = stale slots past the present
    for i, r in enumerate(rows):
        hist[i, :len(r)] = r
    L = jnp.array([len(r) - 1 for r in rows], jnp.int32)
    ctx = Context(jnp.asarray(hist), L, jnp.asarray(hist)[jnp.arange(len(rows)), L], jax.random.key(0),
                  SamplingParams.make(), num_draft=K)
    prop, _, _ = NGram(**kw).propose(None, None, (), ctx, None, None)
    assert prop.q_BKV is None  # deterministic drafts: one-hot q
    return prop.tokens_BK.tolist()


def test_ngram_longest_then_most_recent_match_and_ragged_rows():
    rows = [[1, 2, 3, 4, 9, 1, 2, 3],  # 3-gram [1 2 3] at 0 -> 4 9 1 2
            [5, 6, 7, 5, 6, 8, 5, 6]]  # 2-gram [5 6] at 0 (-> 7) and 3 (-> 8): the latest wins
    assert _propose_ngram(rows, 4, min_n=1, max_n=3) == [[4, 9, 1, 2], [8, 5, 6, 8]]
    assert _propose_ngram(rows[1:], 2, min_n=1, max_n=3, latest=False) == [[7, 5]]


def test_ngram_repeats_the_period_and_never_reads_stale_slots():
    assert _propose_ngram([[1, 2, 1, 2, 1, 2]], 5, min_n=1, max_n=2) == [[1, 2, 1, 2, 1]]
    assert 99 not in sum(_propose_ngram([[3, 4, 5, 3, 4]], 6, min_n=1, max_n=3), [])


def test_ngram_without_match_repeats_last_and_respects_min_n():
    assert _propose_ngram([[1, 2, 3, 4]], 3, min_n=1, max_n=3) == [[4, 4, 4]]
    assert _propose_ngram([[7, 1, 2, 7]], 2, min_n=1, max_n=1) == [[1, 2]]
    assert _propose_ngram([[7, 1, 2, 7]], 2, min_n=2, max_n=3) == [[7, 7]]


@pytest.fixture(scope="module")
def tiny():
    cfg = config.tiny(n_layers=3)
    return cfg, model.init_params(cfg, jax.random.key(0), scale=0.1)


def _prefilled(cfg, params, prompt):
    cache = kv.init_cache(cfg, 1, 32)
    _, _, cache = model.forward(params, cfg, jnp.array([prompt[:-1]]), cache)
    hist = jnp.zeros((1, 32), jnp.int32).at[0, :len(prompt)].set(jnp.array(prompt))
    ctx = Context(hist, cache.lengths_B, jnp.array([prompt[-1]]), jax.random.key(0), SamplingParams.make(),
                  num_draft=3)
    return cache, ctx


def test_layerskip_writes_only_its_layers_of_the_shared_cache(tiny):
    cfg, params = tiny
    cache, ctx = _prefilled(cfg, params, [4, 5, 6, 7, 8])
    prop, _, out = LayerSkip(2).propose(params, None, (), ctx, cache, cfg)
    assert prop.tokens_BK.shape == (1, 3)
    assert out.lengths_B.tolist() == cache.lengths_B.tolist()
    for i in range(cfg.n_layers):
        same = bool(jnp.array_equal(out.k[i], cache.k[i]))
        assert same == (i >= 2)  # layers 0, 1 got draft K/V at L..L+K-1; layer 2 untouched
        np.testing.assert_array_equal(out.k[i][:, :4], cache.k[i][:, :4])  # the accepted past is intact


def test_layerskip_exit_head(tiny):
    cfg, params = tiny
    cache, ctx = _prefilled(cfg, params, [4, 5, 6, 7, 8])
    D = cfg.d_model
    own = {"final_norm": params["final_norm"], "lm_head": params["lm_head"], "adapter": jnp.zeros((D, D))}
    plain, _ = LayerSkip(1)._logits(params, None, cfg, ctx.last_B, cache)
    same, _ = LayerSkip(1)._logits(params, own, cfg, ctx.last_B, cache)
    np.testing.assert_allclose(same, plain, rtol=1e-5, atol=1e-6)
    trained = {"adapter": 0.5 * jax.random.normal(jax.random.key(3), (D, D))}
    other, _ = LayerSkip(1)._logits(params, trained, cfg, ctx.last_B, cache)
    assert not np.allclose(other, plain, atol=1e-3)
    # a trained exit head changes the drafts, never the output
    prompts = [[4, 5, 6, 7, 8], [9, 10]]
    res = speculative_generate(params, cfg, prompts, LayerSkip(1), trained, num_draft=2, max_new_tokens=9,
                               eos_token_ids=())
    assert res.output_ids == generate(params, cfg, prompts, max_new_tokens=9, eos_token_ids=()).output_ids


def test_validation_errors(tiny):
    cfg, params = tiny
    D, V = cfg.d_model, cfg.vocab_size
    with pytest.raises(ValueError, match="exit layer"):
        LayerSkip(0).validate(cfg, None, 2)
    with pytest.raises(ValueError, match="expected \\(64, 64\\)"):
        LayerSkip(1).validate(cfg, {"adapter": jnp.zeros((D, V))}, 2)
    with pytest.raises(ValueError, match="keys among"):
        LayerSkip(1).validate(cfg, {"head": jnp.zeros((D, V))}, 2)
    with pytest.raises(ValueError, match="not an early exit"):
        LayerSkip(cfg.n_layers).validate(cfg, {"final_norm": jnp.ones((D,))}, 2)
    with pytest.raises(ValueError, match="params dict as draft_params"):
        DraftModel(cfg).validate(cfg, None, 2)
    with pytest.raises(ValueError, match="vocabulary"):
        DraftModel(config.tiny(vocab_size=V + 1)).validate(cfg, params, 2)
    with pytest.raises(ValueError, match="no parameters"):
        NGram().validate(cfg, params, 2)


def test_build_from_cli_options(tiny):
    cfg, params = tiny
    assert drafters.build("layerskip", cfg) == (LayerSkip(1), None)  # default: half the depth
    assert drafters.build("ngram", cfg, ngram_min=2, ngram_max=4) == (NGram(2, 4), None)
    d, dp = drafters.build("draft", cfg, draft_model=(cfg, params))
    assert d == DraftModel(cfg) and dp is params
    with pytest.raises(ValueError, match="expected one of draft, layerskip, ngram"):
        drafters.build("eagle9", cfg)


@pytest.mark.parametrize("slim", [False, True])
def test_build_loads_a_draft_model_folder(tiny, tmp_path, slim):
    """--draft-model PATH: an HF folder, or a slim one that takes the embedding from the target."""
    from specjax.heads.draft_io import save_draft_model
    cfg, params = tiny
    dcfg = config.tiny(n_layers=1)
    dparams = {**params, "layers": params["layers"][:1]}
    save_draft_model(tmp_path / "d", dparams, dcfg, shared_embedding=slim)
    d, dp = drafters.build("draft", cfg, target_params=params, draft_model=str(tmp_path / "d"))
    assert d.cfg.n_layers == 1 and d.cfg.vocab_size == cfg.vocab_size
    np.testing.assert_array_equal(dp["embed"], params["embed"])
    np.testing.assert_array_equal(dp["layers"][0]["wqkv"], params["layers"][0]["wqkv"])
    if slim:  # --tree N: the N-node tree fitted for the draft model, from trees.json in its folder
        with pytest.raises(ValueError, match="no fitted trees"):
            drafters.build("draft", cfg, target_params=params, draft_model=str(tmp_path / "d"), tree=3)
        paths = [[0], [1], [0, 0]]
        (tmp_path / "d" / "trees.json").write_text(json.dumps({"draft": {"3": paths}, "eagle3": {"4": [[0]]}}))
        d, _ = drafters.build("draft", cfg, target_params=params, draft_model=str(tmp_path / "d"), tree=3)
        assert d.tree == Tree(paths)
        with pytest.raises(ValueError, match="no 7-node tree for draft"):
            drafters.build("draft", cfg, target_params=params, draft_model=str(tmp_path / "d"), tree=7)


def test_draft_model_tree_options(tiny):
    cfg, params = tiny
    tree = Tree(((0,), (1,), (0, 0)))
    d, _ = drafters.build("draft", cfg, draft_model=(cfg, params), tree=tree)
    assert d == DraftModel(cfg, tree=tree)
    d.validate(cfg, params, 3)
    with pytest.raises(ValueError, match="node count 3"):
        d.validate(cfg, params, 2)
    with pytest.raises(ValueError, match="loaded params has no folder"):
        drafters.build("draft", cfg, draft_model=(cfg, params), tree=3)
    with pytest.raises(ValueError, match="chains only"):
        DraftModel(cfg, min_confidence=0.3, tree=tree).validate(cfg, params, 3)
    with pytest.raises(ValueError, match="drafted by draft, eagle3, medusa, not 'ngram'"):
        drafters.build("ngram", cfg, tree=tree)


def test_a_draft_vocabulary_beside_a_draft_model_cuts_its_lm_head(tiny, tmp_path):
    """``save_draft_model(vocab_ids=...)`` writes draft_vocab.safetensors; loading cuts the LM head to those rows
    unless ``full_vocab``; a file of bad ids is a CheckpointError naming it."""
    from specjax.errors import CheckpointError
    from specjax.heads.draft_io import VOCAB_FILE, load_draft_model, save_draft_model, save_draft_vocab
    cfg, params = tiny
    dcfg = config.tiny(n_layers=1)
    dparams = {**params, "layers": params["layers"][:1]}
    ids = np.array([7, 3, 200, 41], np.int32)
    save_draft_model(tmp_path / "d", dparams, dcfg, shared_embedding=True, vocab_ids=ids)
    rcfg, rdp = load_draft_model(tmp_path / "d", params)
    assert not rcfg.tie_embeddings and rdp["vocab_ids"].tolist() == ids.tolist()
    fcfg, fdp = load_draft_model(tmp_path / "d", params, full_vocab=True)
    assert fcfg == dcfg and "vocab_ids" not in fdp
    np.testing.assert_array_equal(rdp["lm_head"], np.asarray(fdp["embed" if dcfg.tie_embeddings else "lm_head"])[ids])
    for slim in (False, True):  # saved again without one: the earlier draft vocabulary does not cut the new head
        save_draft_model(tmp_path / "d", dparams, dcfg, shared_embedding=True, vocab_ids=ids)
        save_draft_model(tmp_path / "d", dparams, dcfg, shared_embedding=slim)
        assert not (tmp_path / "d" / VOCAB_FILE).exists()
        assert "vocab_ids" not in load_draft_model(tmp_path / "d", params)[1]
    save_draft_vocab(tmp_path / "d", [3, 3])
    with pytest.raises(CheckpointError, match=f"{VOCAB_FILE}: vocab ids must be distinct"):
        load_draft_model(tmp_path / "d", params)
    (tmp_path / "d" / VOCAB_FILE).write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="expected a tensor 'vocab_ids'"):
        load_draft_model(tmp_path / "d", params)
    with pytest.raises(ValueError, match="restricted already"):
        from specjax.speculative.drafters.draft_model import restrict_vocab
        restrict_vocab(rcfg, rdp, ids)


def test_draw_uses_the_same_filtered_distribution_as_the_target():
    logits = jax.random.normal(jax.random.key(0), (4, 16))
    tok, q = draw(jax.random.key(1), logits, SamplingParams.make())
    assert q is None and tok.tolist() == jnp.argmax(logits, -1).tolist()
    sp = SamplingParams.make(0.7, 5, 0.9)
    tok, q = draw(jax.random.key(1), logits, sp)
    np.testing.assert_array_equal(q, sampling.probs(logits, sp))
    assert bool(jnp.all(jnp.take_along_axis(q, tok[:, None], 1) > 0))
