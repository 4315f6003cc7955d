"""Draft trees on a tiny random target (CPU, float32): the tree's tables, the masked verify forward
against plain forwards of each node's path, moving the accepted path's K/V into place, greedy and
sampled tree verification (against a brute-force walk and the target's exact distribution), a draft model's
level-by-level tree rows against plain forwards, and tree decoding with the draft model, EAGLE-3 and Medusa
drafters equal to AR greedy."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax import cache as kv
from specjax import model, sampling
from specjax.generate import generate
from specjax.speculative import DraftModel, speculative_generate, verify
from specjax.speculative.drafters.draft_model import restrict_vocab
from specjax.speculative.drafters.eagle3 import Eagle3
from specjax.speculative.drafters.medusa import Medusa
from specjax.speculative.tree import Tree
from training import tiny

# 9 nodes, depth 3, up to 3 children; BFS order: (0,) (1,) (2,) (0,0) (0,1) (1,0) (2,0) (0,0,0) (0,1,0)
TREE = Tree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (2, 0), (0, 1, 0)))
# a level of one node (depth 2): a draft model's one-row tree step (no norm folding there)
NARROW = Tree(((0,), (1,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)))


@pytest.fixture(scope="module")
def target():
    return tiny.target()


def test_tree_tables():
    t = TREE
    assert t.num_nodes == 9 and t.depth == 3
    assert t.paths[:4] == ((0,), (1,), (2,), (0, 0))
    assert t.parent.tolist() == [0, 0, 0, 0, 1, 1, 2, 3, 4, 5]
    assert t.depths.tolist() == [0, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    assert t.children[0].tolist() == [1, 2, 3] and t.children[1].tolist() == [4, 5, -1]
    assert t.path_to[9].tolist() == [0, 1, 5, 9] and t.path_to[2].tolist() == [0, 2, 2, 2]
    assert t.ancestors[9].nonzero()[0].tolist() == [0, 1, 5, 9]
    assert t.level(2) == (4, 8) and t.top_k(1) == 3 and t.top_k(2) == 2
    assert Tree.chain(3).paths == ((0,), (0, 0), (0, 0, 0)) and Tree.chain(3).is_chain() and not t.is_chain()
    assert hash(Tree(((1,), (0,)))) == hash(Tree(((0,), (1,))))


@pytest.mark.parametrize("paths, match", [((), "1..127 nodes"), (((0,), (0,)), "distinct"),
                                          (((0, 0),), "not prefix-closed"), (((0,), ()), "non-empty"),
                                          (((-1,),), "ranks >= 0"), ("ab", "rank paths")])
def test_bad_trees(paths, match):
    with pytest.raises(ValueError, match=match):
        Tree(paths)


def _prefilled(cfg, tp, prompts, capacity=48, dtype=jnp.float32):
    toks = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
    for b, p in enumerate(prompts):
        toks[b, :len(p)] = p
    cache = kv.init_cache(cfg, len(prompts), capacity, dtype)
    _, _, cache = model.forward(tp, cfg, jnp.asarray(toks), cache)
    return kv.set_lengths(cache, jnp.asarray([len(p) for p in prompts]))


def test_tree_forward_rows_equal_plain_forwards_of_their_paths(target):
    """Row i of the masked forward over [root, nodes] equals the last row of a plain cached forward over
    the root and node i's ancestors (positions, mask and taps), for ragged cache lengths."""
    cfg, tp = target
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3, 4]]
    cache = _prefilled(cfg, tp, prompts)
    toks_BN1 = jnp.asarray(np.random.default_rng(0).integers(1, cfg.vocab_size, (2, TREE.num_nodes + 1)), jnp.int32)
    logits, taps, _ = model.forward(tp, cfg, toks_BN1, cache, taps=(1,), tree_TT=TREE.ancestors)
    for i in range(TREE.num_nodes + 1):
        path = TREE.path_to[i][:TREE.depths[i] + 1]
        ref_logits, ref_taps, _ = model.forward(tp, cfg, toks_BN1[:, path], cache, taps=(1,))
        np.testing.assert_allclose(logits[:, i], ref_logits[:, -1], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(taps[0][:, i], ref_taps[0][:, -1], rtol=2e-5, atol=2e-5)


def test_gather_rows_puts_the_accepted_path_in_position_order(target):
    cfg, tp = target
    cache = _prefilled(cfg, tp, [[5, 6, 7, 8], [3, 4, 5, 6, 7, 8]])
    toks_BN1 = jnp.asarray(np.random.default_rng(1).integers(1, cfg.vocab_size, (2, TREE.num_nodes + 1)), jnp.int32)
    _, _, tree_cache = model.forward(tp, cfg, toks_BN1, cache, tree_TT=TREE.ancestors)
    nodes_BK1 = jnp.asarray([TREE.path_to[9], TREE.path_to[6]])  # depth 3 and depth 2 (padded with itself)
    moved = kv.gather_rows(tree_cache, cache.lengths_B, nodes_BK1)
    for b in range(2):  # one sequence alone takes the in-place path (no vmap): the same rows
        alone = kv.gather_rows(jax.tree.map(lambda x: x[b:b + 1], tree_cache), cache.lengths_B[b:b + 1],
                               nodes_BK1[b:b + 1])
        for got, want in zip(alone.k + alone.v, moved.k + moved.v):
            np.testing.assert_array_equal(got[0], want[b])
    for b, n in enumerate((3, 2)):
        path = nodes_BK1[b, :n + 1]
        _, _, chain = model.forward(tp, cfg, toks_BN1[b:b + 1, path], kv.KVCache(
            k=tuple(c[b:b + 1] for c in cache.k), v=tuple(c[b:b + 1] for c in cache.v),
            lengths_B=cache.lengths_B[b:b + 1]))
        L = int(cache.lengths_B[b])
        for got, want in zip(moved.k + moved.v, chain.k + chain.v):
            np.testing.assert_allclose(got[b, :L + n + 1], want[0, :L + n + 1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tree, prompts", [(TREE, [[5, 6, 7, 8, 9, 10, 11], [3, 4]]), (NARROW, [[3, 4, 5]])],
                         ids=["wide-B2", "narrow-B1"])
def test_tree_level_rows_equal_plain_forwards_of_their_paths(target, tree, prompts):
    """``forward(tree_rows=...)`` level by level, as ``DraftModel`` drafts a tree (the root at slot L, node i at
    slot L + i): each node's logits equal the last row of a plain cached forward over its path, for ragged cache
    lengths, and for a level of one node at B = 1 (one row, where a plain step would fold the norm and mask by
    position)."""
    cfg, tp = target
    cache = _prefilled(cfg, tp, prompts)  # slots 0..L-1; the root (the last token) goes to slot L
    B, L_B = len(prompts), cache.lengths_B
    toks_BN1 = jnp.asarray(np.random.default_rng(3).integers(1, cfg.vocab_size, (B, tree.num_nodes + 1)), jnp.int32)
    _, _, c = model.forward(tp, cfg, toks_BN1[:, :1], cache)
    visible_NN = tree.ancestors[1:, 1:]
    for d in range(1, tree.depth + 1):
        lo, hi = tree.level(d)
        logits, _, c = model.forward(tp, cfg, toks_BN1[:, lo:hi], kv.set_lengths(c, L_B + lo),
                                     tree_rows=(visible_NN[lo - 1:hi - 1], lo - 1, d))
        for i in range(lo, hi):
            path = tree.path_to[i][:d + 1]
            ref, _, _ = model.forward(tp, cfg, toks_BN1[:, path], cache)
            np.testing.assert_allclose(logits[:, i - lo], ref[:, -1], rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="tree_rows"):
        model.forward(tp, cfg, toks_BN1[:, :2], cache, tree_rows=(visible_NN[:3], 0, 1))


def _walk(t_N1, nodes_N, tree, cur=0, path=(0,)):
    """Brute force: every path from the root whose nodes equal their parent's argmax; the deepest wins
    (siblings may repeat a token; ties go to the lower end node). Returns (n, tokens, path)."""
    best = (len(path) - 1, [int(t_N1[j]) for j in path], list(path))
    for c in tree.children[cur]:
        if c >= 0 and nodes_N[c - 1] == t_N1[cur]:
            cand = _walk(t_N1, nodes_N, tree, c, path + (c,))
            if (cand[0], -cand[2][-1]) > (best[0], -best[2][-1]):
                best = cand
    return best


def test_greedy_tree_verify_equals_a_brute_force_walk():
    V, B = 3, 256  # a tiny vocabulary, so that long paths and sibling duplicates occur
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(B, TREE.num_nodes + 1, V)).astype(np.float32)
    nodes = rng.integers(0, V, (B, TREE.num_nodes)).astype(np.int32)
    v = verify.tree_verify(jax.random.key(0), jnp.asarray(logits), jnp.asarray(nodes), TREE,
                           sampling.SamplingParams.make(0.0))
    depths = collections.Counter()
    for b in range(B):
        n, toks, path = _walk(logits[b].argmax(-1), nodes[b], TREE)
        depths[n] += 1
        assert int(v.num_accepted_B[b]) == n
        assert v.tokens_BK1[b, :n + 1].tolist() == toks and v.nodes_BK1[b, :n + 1].tolist() == path
    assert all(depths[d] > 0 for d in range(TREE.depth + 1)), depths


def _sampled_tree_verify_check():
    V, n = 6, 60000
    rng = np.random.default_rng(7)  # every p checked below has >= 4 tokens after top-p
    logits_N1V = rng.normal(size=(TREE.num_nodes + 1, V)).astype(np.float32) * 0.8
    nodes_N = np.array([2, 0, 2, 1, 3, 4, 0, 5, 1], np.int32)  # root's children 2, 0, 2 (a duplicate)
    sp = sampling.SamplingParams.make(0.8, 0, 0.95)
    p_N1V = np.asarray(sampling.probs(jnp.asarray(logits_N1V), sp), np.float64)
    v = verify.tree_verify(jax.random.key(4), jnp.broadcast_to(jnp.asarray(logits_N1V), (n,) + logits_N1V.shape),
                           jnp.broadcast_to(jnp.asarray(nodes_N), (n, TREE.num_nodes)), TREE, sp)
    toks, num = np.asarray(v.tokens_BK1), np.asarray(v.num_accepted_B)
    assert (num >= 1).mean() > 0.3 and (num >= 2).mean() > 0.05  # the test exercises acceptance

    def check(samples, p_V):
        exp = p_V * len(samples)
        keep = exp > 0
        obs = np.bincount(samples, minlength=V)
        assert obs[~keep].sum() == 0 and keep.sum() > 1  # a one-token p would test nothing
        assert stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue > 1e-3

    check(toks[:, 0], p_N1V[0])
    for x, node in ((0, 2), (2, 1), (1, 4)):  # token x accepted at node (the first child carrying x)
        sel = (num >= 1) & (toks[:, 0] == x) if node < 4 else (num >= 2) & (toks[:, 1] == x) & (toks[:, 0] == 2)
        col = 1 if node < 4 else 2
        assert sel.sum() > 500
        check(toks[sel, col], p_N1V[node])


def test_sampled_tree_verify_emits_the_target_distribution():
    """At the verifier: the first emitted token follows the root's p, and after an accepted node x the
    next one follows x's p (top-p filtered, T = 0.8), whatever the nodes are (siblings repeat a token)."""
    _sampled_tree_verify_check()


def test_a_tree_verifier_that_forgets_rejected_children_fails_the_check(monkeypatch):
    monkeypatch.setattr(verify, "_remove", lambda p_BV, x_B, where_B: p_BV)
    with pytest.raises(AssertionError):
        _sampled_tree_verify_check()


@pytest.fixture(scope="module")
def drafters(target):
    cfg, tp = target
    (ecfg, edp), (mcfg, mp) = tiny.eagle3_head(*target), tiny.medusa_heads(target[0], num_heads=3)
    dcfg, dp = tiny.target(seed=5, n_layers=2)
    rcfg, rdp = restrict_vocab(dcfg, dp, np.random.default_rng(6).permutation(cfg.vocab_size)[:160])
    return {"eagle3": (Eagle3(ecfg, TREE), edp), "medusa": (Medusa(mcfg, TREE), mp),
            "draft": (DraftModel(dcfg, tree=TREE), dp), "draft-narrow": (DraftModel(dcfg, tree=NARROW), dp),
            "draft-vocab": (DraftModel(rcfg, tree=TREE), rdp), "draft-self": (DraftModel(cfg, tree=NARROW), tp)}


@pytest.mark.parametrize("kind", ["eagle3", "medusa", "draft", "draft-narrow", "draft-vocab", "draft-self"])
def test_tree_decoding_equals_ar_greedy(target, drafters, kind):
    cfg, tp = target
    drafter, dp = drafters[kind]
    tree = drafter.tree
    prompts = [[5, 6, 7, 8, 9], [3, 4], list(range(10, 31))]
    free = generate(tp, cfg, prompts, max_new_tokens=24, eos_token_ids=())
    eos = free.output_ids[0][5]  # a token of the first output as EOS: rows stop at different cycles
    ref = generate(tp, cfg, prompts, max_new_tokens=24, eos_token_ids=(eos,))
    out = speculative_generate(tp, cfg, prompts, drafter, dp, max_new_tokens=24, eos_token_ids=(eos,))
    assert out.output_ids == ref.output_ids
    assert out.stats.accepted_BK.shape == (3, tree.depth) and out.stats.num_draft == tree.num_nodes
    for n, c, a in zip(out.new_tokens, out.stats.cycles_B, out.stats.accepted_BK.sum(axis=1)):
        assert c <= n - 1 <= c + a
    if kind == "draft-self":  # the target as its own draft: every cycle but a row's last accepts a whole path,
        # which the next cycle's drafts attend to (the path's rows moved into place in the draft model's cache)
        for n, c, a in zip(out.new_tokens, out.stats.cycles_B, out.stats.accepted_BK):
            assert a.min() >= c - 1 and n - 1 >= (c - 1) * (tree.depth + 1), (n, c, a)


def test_tree_options_are_checked(target, drafters):
    cfg, tp = target
    drafter, dp = drafters["medusa"]
    with pytest.raises(ValueError, match="node count 9"):
        speculative_generate(tp, cfg, [[1, 2]], drafter, dp, num_draft=4)
    deep = Medusa(drafter.cfg, Tree.chain(4))
    with pytest.raises(ValueError, match="at most 3 tokens deep"):
        speculative_generate(tp, cfg, [[1, 2]], deep, dp)
    with pytest.raises(ValueError, match="ancestor mask"):
        model.forward(tp, cfg, jnp.ones((1, 3), jnp.int32), tree_TT=TREE.ancestors)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 2])
def test_gpu_tree_forward_kernel_vs_reference(monkeypatch, B):
    """On Hopper, a bf16 tree forward of 16 and 32 rows (the decode kernel in tree mode) and of 64 rows (the
    masked XLA path) against SPECJAX_ATTENTION=reference: close logits."""
    from specjax import config
    cfg = config.tiny(d_model=384, n_heads=6, n_kv_heads=2, ffn_dim=512, vocab_size=512)
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    small = Tree(tuple((0,) * i + (r,) for i in range(5) for r in range(3))[:15])
    mid = Tree(tuple((r,) for r in range(3)) + tuple((a, b) for a in range(3) for b in range(6))
               + tuple((0, b, c) for b in range(2) for c in range(5)))
    big = Tree(tuple((r,) for r in range(7)) + tuple((a, b) for a in range(7) for b in range(8)))
    prompts = [list(range(3, 40)), list(range(50, 71))][:B]

    def run(tree):
        cache = _prefilled(cfg, params, prompts, capacity=256, dtype=jnp.bfloat16)
        toks = jax.random.randint(jax.random.key(2), (B, tree.num_nodes + 1), 3, cfg.vocab_size)
        return np.asarray(model.forward(params, cfg, toks, cache, tree_TT=tree.ancestors)[0])

    cache = _prefilled(cfg, params, prompts, capacity=256, dtype=jnp.bfloat16)
    for tree in (small, mid):
        text = str(jax.make_jaxpr(lambda t, c: model.forward(params, cfg, t, c, tree_TT=tree.ancestors)[0])(
            jnp.ones((B, tree.num_nodes + 1), jnp.int32), cache))
        assert "rope_attention_write" in text, f"the {tree.num_nodes + 1}-row tree did not take the decode kernel"
    assert mid.num_nodes == 31
    for tree in (small, mid, big):
        got = run(tree)
        with monkeypatch.context() as m:
            m.setenv("SPECJAX_ATTENTION", "reference")
            ref = run(tree)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


def tree_level_logits(params, cfg, prompts, tree: Tree) -> np.ndarray:
    """Logits [B, N, V] at the N nodes of ``tree``, drafted level by level after ``prompts`` with a bf16 cache as
    the draft model drafts: the root's one-row forward, then each depth's nodes as one ``forward(tree_rows=...)``
    (random tokens at root and nodes). Also used by ``benchmarks/tree_levels_probe.py``."""
    B = len(prompts)
    cache = _prefilled(cfg, params, prompts, capacity=256, dtype=jnp.bfloat16)
    toks = jax.random.randint(jax.random.key(2), (B, tree.num_nodes + 1), 3, cfg.vocab_size)
    _, _, c = model.forward(params, cfg, toks[:, :1], cache)
    out, visible = [], tree.ancestors[1:, 1:]
    for d in range(1, tree.depth + 1):
        lo, hi = tree.level(d)
        lg, _, c = model.forward(params, cfg, toks[:, lo:hi], kv.set_lengths(c, cache.lengths_B + lo),
                                 tree_rows=(visible[lo - 1:hi - 1], lo - 1, d))
        out.append(np.asarray(lg))
    return np.concatenate(out, axis=1)


LEVELS_TREE = Tree(tuple((r,) for r in range(4)) + tuple((a, b) for a in range(2) for b in range(3))
                   + ((0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1)))  # levels of 1 to 6 nodes


def tree_levels_case(B: int):
    """``(cfg, bf16 params, prompts)`` of the tree-levels test below (and ``benchmarks/tree_levels_probe.py``)."""
    from specjax import config
    cfg = config.tiny(d_model=384, n_heads=6, n_kv_heads=2, ffn_dim=512, vocab_size=512)
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16, scale=0.1)  # peaked: few near-ties
    return cfg, params, [list(range(3, 40)), list(range(50, 71))][:B]


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 2])
def test_gpu_draft_model_tree_levels_kernel_vs_reference(monkeypatch, B):
    """On Hopper, a bf16 draft model's tree levels (``forward(tree_rows=...)``: the decode kernel in tree mode with
    the level's offset, one-row levels included) against SPECJAX_ATTENTION=reference: logits as close to the
    float32 forward's as the reference attention's are, and greedy tree decoding equal to AR greedy with float32
    matmul operands.

    The kernel and the reference attention round differently in bf16, so their logits differ by about as much
    as each differs from the float32 forward; this test once bounded that difference itself by 1e-2, which an
    H100 read as 1.06e-2 (2026-12-06, the H200 passed it on 2026-12-04; the CPU interpreter gives 0.92e-2 / 0.83e-2
    for B = 1 / 2, while kernel and reference were 1.66e-2 / 1.71e-2 and 1.59e-2 / 1.56e-2 from float32;
    benchmarks/NOTES.md item 48). A wrong mask bit or offset moves a row's logits by far more than 25 %."""
    from specjax import config
    cfg, params, prompts = tree_levels_case(B)
    tree = LEVELS_TREE
    got = tree_level_logits(params, cfg, prompts, tree)
    with monkeypatch.context() as m:
        m.setenv("SPECJAX_ATTENTION", "reference")
        ref = tree_level_logits(params, cfg, prompts, tree)
    f32 = dataclasses.replace(cfg, compute_dtype="float32")
    exact = tree_level_logits(params, f32, prompts, tree)  # float32 operands: the reference attention, no kernel
    err = lambda a: float(np.linalg.norm(a - exact) / np.linalg.norm(exact))
    assert err(got) < 1.25 * err(ref), f"kernel {err(got):.2e} from float32, reference attention {err(ref):.2e}"
    dcfg = dataclasses.replace(config.tiny(d_model=384, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=512,
                                           vocab_size=512), compute_dtype="float32")
    dp = model.init_params(dcfg, jax.random.key(1), dtype=jnp.bfloat16, scale=0.1)
    ar = generate(params, f32, prompts, max_new_tokens=32, eos_token_ids=())
    spec = speculative_generate(params, f32, prompts, DraftModel(dcfg, tree=tree), dp, max_new_tokens=32,
                                eos_token_ids=())
    assert spec.output_ids == ar.output_ids
