"""Decode/verify attention kernel: Pallas interpreter, CUDA lowering and dispatch on CPU; real runs
under @pytest.mark.gpu."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import mesh as mesh_lib

from pallas_kernels import dispatch
from pallas_kernels.decode_attention import (WIDE_QUERIES, TuningConfig, decode_attention,
                                             decode_attention_reference, default_config, packed_rows,
                                             rope_attention_write, rope_attention_write_reference,
                                             split_geometry)
from specjax.cache import set_lengths

pytestmark = pytest.mark.filterwarnings("ignore:.*Pallas Triton backend is deprecated")

SPLIT = TuningConfig(block_m=32, block_k=32, split_blocks=2)   # several row tiles, 64-key splits
ONE = TuningConfig(block_k=32, split_blocks=64)                # S <= 2048: one split, no combine
CONFIGS = {"split": SPLIT, "one": ONE, "default": None}


def _inputs(seed, B, T, H, S, G, d, dtype):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    dt = jnp.dtype(dtype)
    return (jax.random.normal(kq, (B, T, H, d), dt), jax.random.normal(kk, (B, S, G, d), dt),
            jax.random.normal(kv, (B, S, G, d), dt))


def _ragged_positions(B, T, S):
    """Row 0 starts at position 0 (its first query sees one key), the last row ends at S - 1."""
    starts = np.linspace(0, S - T, B).astype(np.int32)
    return jnp.asarray(starts[:, None] + np.arange(T, dtype=np.int32)[None])


def _check_close(q, k, v, q_pos, o, tol):
    ref = np.asarray(decode_attention_reference(q, k, v, q_pos))
    o = np.asarray(o)
    assert o.dtype == np.float32 and o.shape == q.shape
    assert np.isfinite(o).all(), "kernel output has NaN/inf (an unwritten or bad element)"
    rel = np.linalg.norm(o - ref) / np.linalg.norm(ref)
    assert rel < tol, f"relative error {rel:.2e} >= {tol}"
    # Row 0's first query sees exactly one key: its output is that key's value, bit for bit.
    R = q.shape[2] // k.shape[2]
    np.testing.assert_array_equal(o[0, 0], np.repeat(np.asarray(v[0, 0], np.float32), R, axis=0))


def _assert_t1_equals_verify_rows(q, k, v, q_pos, run):
    """Each query alone (T = 1) and a prefix (T = 3) give bitwise the rows of the full T call."""
    T = q.shape[1]
    full = np.asarray(run(q, k, v, q_pos))
    for t in sorted({0, T // 2, T - 1}):
        one = np.asarray(run(q[:, t:t + 1], k, v, q_pos[:, t:t + 1]))
        np.testing.assert_array_equal(one[:, 0], full[:, t], err_msg=f"T=1 vs row {t} of T={T}")
    np.testing.assert_array_equal(np.asarray(run(q[:, :3], k, v, q_pos[:, :3])), full[:, :3])


# ---------------------------------------------------------------- CPU: Pallas interpreter
# Pairwise, not the full product (CI time): every (T, R) pair once, its head dim and config chosen so that every
# (T or R, head dim) and (T or R, config) pair occurs; then float16 and hd 256.
_N = list(CONFIGS)
INTERP_CASES = ([(T, R, (64, 128)[(i + j) % 2], "bfloat16", _N[(i + 2 * j) % 3])
                 for i, T in enumerate((1, 5, 8)) for j, R in enumerate((1, 3, 4))]
                + [(5, 1, 64, "float16", _N[0]), (5, 3, 64, "float16", _N[1]), (1, 4, 128, "float16", _N[2]),
                   (8, 3, 128, "float16", _N[0]), (5, 3, 256, "bfloat16", _N[1]),
                   (24, 3, 64, "bfloat16", _N[0]), (32, 1, 128, "bfloat16", _N[2])])  # the wide layout (T > 16)


@pytest.mark.parametrize("T,R,d,dtype,name", INTERP_CASES)
def test_interpreter_matches_reference(T, R, d, dtype, name):
    B, G, S = 3, 2, 200                                  # S is not a multiple of any block_k
    q, k, v = _inputs(T * 100 + R * 10 + d, B, T, G * R, S, G, d, dtype)
    q_pos = _ragged_positions(B, T, S)
    o = decode_attention(q, k, v, q_pos, config=CONFIGS[name], interpret=True)
    _check_close(q, k, v, q_pos, o, tol=1e-2 if dtype == "bfloat16" else 2e-3)


@pytest.mark.parametrize("cfg,sizes", [(SPLIT, (150, 300)), (TuningConfig(block_k=32, split_blocks=5), (150, 300)),
                                       (ONE, (150, 300)), (TuningConfig(block_k=16, split_blocks=1), (300, 600))])
def test_interpreter_output_independent_of_cache_capacity(cfg, sizes):
    """Same queries and the same first 150 slots: caches of ``sizes`` slots give the same bits (with
    split_blocks=5, 150 slots fit one split and 300 need the combine kernel; with 16-key splits the combine
    kernel runs two unrolled steps of SPLITS_PER_STEP = 16 splits at 300 slots and three at 600). On the
    interpreter a loop of ONE step (XLA:CPU inlines it) may round differently from the same loop run twice,
    so the 16-key case keeps both at two or more; the GPU test compares one step against two."""
    B, T, H, G, d = 2, 4, 6, 2, 64
    q, k, v = _inputs(8, B, T, H, max(sizes), G, d, "bfloat16")
    q_pos = jnp.asarray([[0], [146]], jnp.int32) + jnp.arange(T, dtype=jnp.int32)[None]
    run = lambda S: np.asarray(decode_attention(q, k[:, :S], v[:, :S], q_pos, config=cfg, interpret=True))
    np.testing.assert_array_equal(run(sizes[0]), run(sizes[1]))


@pytest.mark.parametrize("name", CONFIGS)
def test_interpreter_t1_equals_verify_row_bitwise(name):
    B, T, H, S, G, d = 2, 9, 12, 150, 4, 64
    q, k, v = _inputs(3, B, T, H, S, G, d, "bfloat16")
    # The T=9 calls reach key blocks / splits past the position of their first query (64, 128).
    q_pos = jnp.asarray([[60], [120]], jnp.int32) + jnp.arange(T, dtype=jnp.int32)[None]
    run = lambda *a: decode_attention(*a, config=CONFIGS[name], interpret=True)
    _assert_t1_equals_verify_rows(q, k, v, q_pos, run)


def test_interpreter_t1_equals_wide_verify_row_bitwise():
    """The wide layout (T = 20 packs R * 32 rows: two 64-row tiles) gives each query the bits of a T = 1 call."""
    B, T, H, S, G, d = 2, 20, 6, 150, 2, 64
    q, k, v = _inputs(13, B, T, H, S, G, d, "bfloat16")
    q_pos = jnp.asarray([[50], [125]], jnp.int32) + jnp.arange(T, dtype=jnp.int32)[None]
    _assert_t1_equals_verify_rows(q, k, v, q_pos, lambda *a: decode_attention(*a, config=SPLIT, interpret=True))


def test_interpreter_row_that_sees_nothing_is_zero():
    q, k, v = _inputs(5, 2, 2, 4, 70, 2, 64, "bfloat16")
    q_pos = jnp.asarray([[-1, -1], [3, 69]], jnp.int32)
    o = np.asarray(decode_attention(q, k, v, q_pos, config=SPLIT, interpret=True))
    np.testing.assert_array_equal(o[0], 0.0)
    ref = np.asarray(decode_attention_reference(q, k, v, q_pos))
    np.testing.assert_allclose(o[1], ref[1], atol=2e-2)


# ------------------------------------------- CPU: the fused entry (RoPE + cache writes + attention)
def _fused_inputs(seed, B, T, H, G, d, S, dtype, starts):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    qkv = jax.random.normal(kq, (B, T, H + 2 * G, d), jnp.float32)
    k, v = (jax.random.normal(x, (B, S, G, d), jnp.dtype(dtype)) for x in (kk, kv))
    start = jnp.asarray(starts, jnp.int32)
    inv = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)
    ang = (np.asarray(starts)[:, None] + np.arange(T))[..., None] * inv
    ang = np.concatenate([ang, ang], -1).astype(np.float32)
    return qkv, k, v, jnp.cos(ang), jnp.sin(ang), start


def _check_fused(args, H, cfg, interpret=True, tol=1e-2):
    o, k, v = rope_attention_write(*args, n_heads=H, config=cfg, interpret=interpret)
    ref_o, ref_k, ref_v = rope_attention_write_reference(*args, n_heads=H)
    k, ref_k = np.asarray(k, np.float32), np.asarray(ref_k, np.float32)
    np.testing.assert_array_equal(np.asarray(v), np.asarray(ref_v))   # v: copied, every slot bit for bit
    new = np.zeros(k.shape[:2], bool)                                 # k: RoPE may round by one ulp
    for b, s0 in enumerate(np.asarray(args[-1])):
        new[b, s0:s0 + args[0].shape[1]] = True
    np.testing.assert_array_equal(k[~new], ref_k[~new])               # other slots untouched
    np.testing.assert_allclose(k[new], ref_k[new], rtol=float(jnp.finfo(args[1].dtype).eps), atol=1e-6)
    o, ref_o = np.asarray(o), np.asarray(ref_o)
    assert o.shape == ref_o.shape and np.isfinite(o).all()
    rel = np.linalg.norm(o - ref_o) / np.linalg.norm(ref_o)
    assert rel < tol, f"relative error {rel:.2e} >= {tol}"
    return o, k, v


FUSED_CASES = [(1, 3, 64, "bfloat16"), (5, 3, 64, "bfloat16"), (8, 4, 128, "float16"), (16, 1, 64, "bfloat16"),
               (5, 3, 256, "bfloat16"), (32, 3, 64, "bfloat16")]


# each shape with one or two configs, each config on two or three shapes (not all 15 pairs: CI time)
FUSED_RUNS = [(0, "split"), (0, "one"), (1, "default"), (2, "split"), (3, "one"), (3, "default"), (4, "split"),
              (4, "default"), (5, "split")]


@pytest.mark.parametrize("T,R,d,dtype,name", [FUSED_CASES[i] + (n,) for i, n in FUSED_RUNS])
def test_interpreter_fused_matches_reference(T, R, d, dtype, name):
    """Ragged starts: sequence 0 starts at slot 0 (its first query sees only its own new key), the
    last one ends at the last slot."""
    B, G, S = 3, 2, 130
    args = _fused_inputs(T + R, B, T, G * R, G, d, S, dtype, [0, 61, S - T])
    _check_fused(args, G * R, CONFIGS[name])


@pytest.mark.parametrize("name", CONFIGS)
def test_interpreter_fused_t1_equals_verify_row_bitwise(name):
    """Decode steps (T = 1, each on the cache the previous ones wrote) give bitwise the rows of one
    T = 9 call, whose new keys straddle a 64-key block (and split) boundary."""
    B, T, H, G, d, S = 2, 9, 6, 2, 64, 150
    args = _fused_inputs(4, B, T, H, G, d, S, "bfloat16", [58, 120])
    _assert_fused_steps_equal_verify(args, lambda *a: rope_attention_write(*a, n_heads=H, config=CONFIGS[name],
                                                                           interpret=True))


TREE_BITS = np.array([0b1, 0b11, 0b101, 0b1001, 0b10011, 0b100011, 0b1000101, 0b10010011, 0b100100011],
                     np.int32)  # 9 rows of a draft tree: root, 3 children, then grandchildren (ancestor bitmasks)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("offset", [0, 5])
def test_interpreter_fused_tree_rows_match_reference(name, offset):
    """Tree mode: each new row sees the context before ``start - offset`` and, from there on, the slots its
    bits name; with ``offset`` > 0 the rows sit after other tree rows (the EAGLE-3 head's later levels).
    Bits are given relative to ``start - offset``, so shift them by the offset."""
    B, T, H, G, d, S = 3, 9, 6, 2, 64, 150
    args = _fused_inputs(7, B, T, H, G, d, S, "bfloat16", [offset, 61, S - T])
    bits = jnp.asarray(TREE_BITS << offset)
    o, k, v = rope_attention_write(*args, n_heads=H, config=CONFIGS[name], interpret=True, tree_bits_T=bits,
                                   tree_offset=offset)
    ref_o, ref_k, ref_v = rope_attention_write_reference(*args, n_heads=H, tree_bits_T=bits, tree_offset=offset)
    np.testing.assert_array_equal(np.asarray(v), np.asarray(ref_v))
    rel = np.linalg.norm(np.asarray(o) - np.asarray(ref_o)) / np.linalg.norm(np.asarray(ref_o))
    assert rel < 1e-2, rel
    causal = rope_attention_write_reference(*args, n_heads=H)[0]  # the mask matters: not the causal output
    assert np.linalg.norm(np.asarray(causal) - np.asarray(ref_o)) / np.linalg.norm(np.asarray(ref_o)) > 0.1


def test_interpreter_fused_wide_tree_matches_reference():
    """A 31-node tree's verify (32 rows, the wide layout; bit 31, the sign bit, marks the last slot) against
    the reference, with ragged starts."""
    from specjax.speculative.tree import Tree
    tree = Tree(((0,), (1,), (2,)) + tuple((i, j) for i in range(3) for j in range(3))
                + tuple((0, 0, j) for j in range(8)) + tuple((0, 0, 0, j) for j in range(11)))
    bits = jnp.asarray(dispatch.tree_bits(tree.ancestors))
    assert tree.num_nodes + 1 == 32 and int(bits[-1]) < 0
    B, T, H, G, d, S = 2, 32, 6, 2, 64, 150
    args = _fused_inputs(9, B, T, H, G, d, S, "bfloat16", [0, 100])
    o, k, v = rope_attention_write(*args, n_heads=H, config=SPLIT, interpret=True, tree_bits_T=bits)
    ref_o, ref_k, ref_v = rope_attention_write_reference(*args, n_heads=H, tree_bits_T=bits)
    np.testing.assert_array_equal(np.asarray(v), np.asarray(ref_v))
    rel = np.linalg.norm(np.asarray(o) - np.asarray(ref_o)) / np.linalg.norm(np.asarray(ref_o))
    assert rel < 1e-2, rel
    causal = rope_attention_write_reference(*args, n_heads=H)[0]
    assert np.linalg.norm(np.asarray(causal) - np.asarray(ref_o)) / np.linalg.norm(np.asarray(ref_o)) > 0.1


def test_fused_tree_rejects_bad_bits():
    args = _fused_inputs(7, 1, 9, 6, 2, 64, 150, "bfloat16", [3])
    with pytest.raises(ValueError, match="tree_bits must be"):
        rope_attention_write(*args, n_heads=6, interpret=True, tree_bits_T=jnp.zeros(8, jnp.int32))
    with pytest.raises(ValueError, match="tree_bits must be"):
        rope_attention_write(*args, n_heads=6, interpret=True, tree_bits_T=jnp.zeros(9, jnp.int32), tree_offset=24)


def _with_sumsq_head(args, D=96):
    """``args`` of the fused entry with q|k|v read as those of an un-normalised input: one more head
    holding each token's sum of squares (``specjax.layers.linear_sumsq``), all d entries equal."""
    qkv, *rest = args
    B, T, _, d = qkv.shape
    x = jax.random.normal(jax.random.key(7), (B, T, D), jnp.float32) * 3.0
    ss = jnp.broadcast_to(jnp.sum(x * x, -1)[:, :, None, None], (B, T, 1, d))
    return (jnp.concatenate([qkv, ss], axis=2), *rest)


@pytest.mark.parametrize("T,R,d,dtype", [(1, 3, 64, "bfloat16"), (5, 3, 64, "bfloat16"), (8, 4, 128, "float16")])
@pytest.mark.parametrize("name", ["split", "default"])
def test_interpreter_fused_norm_matches_reference(T, R, d, dtype, name):
    """norm_dim > 0 (RMSNorm folded in): the kernel scales q|k|v by 1/rms from the sum-of-squares head,
    as the reference does; and the reference is the unnormalised entry on q|k|v scaled first."""
    B, G, S, D, eps = 3, 2, 130, 96, 1e-5
    args = _with_sumsq_head(_fused_inputs(T + R, B, T, G * R, G, d, S, dtype, [0, 61, S - T]), D)
    o, k, v = rope_attention_write(*args, n_heads=G * R, config=CONFIGS[name], interpret=True, norm_dim=D,
                                   norm_eps=eps)
    ref = rope_attention_write_reference(*args, n_heads=G * R, norm_dim=D, norm_eps=eps)
    qkv = args[0]
    scaled = qkv[:, :, :-1] * jax.lax.rsqrt(qkv[:, :, -1:, :1] / D + eps)
    plain = rope_attention_write_reference(scaled, *args[1:], n_heads=G * R)
    for a, b in zip(ref, plain):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(v, np.float32), np.asarray(ref[2], np.float32),
                               rtol=float(jnp.finfo(dtype).eps), atol=1e-6)
    np.testing.assert_allclose(np.asarray(k, np.float32), np.asarray(ref[1], np.float32),
                               rtol=float(jnp.finfo(dtype).eps), atol=1e-6)
    rel = np.linalg.norm(np.asarray(o) - np.asarray(ref[0])) / np.linalg.norm(np.asarray(ref[0]))
    assert rel < 1e-2, f"relative error {rel:.2e}"
    # the scale matters: without it the output differs (the test could not pass on an ignored head)
    unscaled = rope_attention_write_reference(qkv[:, :, :-1], *args[1:], n_heads=G * R)[0]
    assert np.linalg.norm(np.asarray(unscaled) - np.asarray(ref[0])) > 10 * np.linalg.norm(np.asarray(o) - np.asarray(ref[0]))


def test_fused_norm_rejects_bad_inputs():
    args = _fused_inputs(0, 1, 1, 6, 2, 64, 32, "bfloat16", [0])
    with pytest.raises(ValueError, match=r"H\+2G\+1"):          # norm on, no sum-of-squares head
        rope_attention_write(*args, n_heads=6, interpret=True, norm_dim=96, norm_eps=1e-5)
    with pytest.raises(ValueError, match="norm_eps > 0"):
        rope_attention_write(*_with_sumsq_head(args), n_heads=6, interpret=True, norm_dim=96)


def _assert_out_dtype_rounds_once(args, H, interpret, names=("one", "split", "default"),
                                  dtypes=(jnp.bfloat16, jnp.float16), **kw):
    """``out_dtype`` gives the bits of the float32 output rounded (one kernel store, no XLA convert), in
    each config of ``names``: one split (the split kernel stores o) and several (the combine kernel does);
    with the norm and tree modes passed through ``kw``. The caches are the same either way."""
    for name in names:
        f32 = rope_attention_write(*args, n_heads=H, config=CONFIGS[name], interpret=interpret, **kw)
        for dt in dtypes:
            low = rope_attention_write(*args, n_heads=H, config=CONFIGS[name], interpret=interpret, out_dtype=dt, **kw)
            assert low[0].dtype == dt and low[0].shape == f32[0].shape
            np.testing.assert_array_equal(np.asarray(low[0]), np.asarray(f32[0].astype(dt)), err_msg=f"{name} {dt}")
            for a, b in zip(low[1:], f32[1:]):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("mode", ["plain", "norm", "tree"])
def test_interpreter_out_dtype_is_the_rounded_float32_output(mode):
    B, T, G, R, d, S = 3, 5, 2, 3, 64, 130
    args = _fused_inputs(11, B, T, G * R, G, d, S, "bfloat16", [0, 61, S - T])
    kw = {}
    if mode == "norm":
        args, kw = _with_sumsq_head(args), dict(norm_dim=96, norm_eps=1e-5)
    elif mode == "tree":
        kw = dict(tree_bits_T=jnp.asarray([1, 3, 5, 9, 17], jnp.int32))  # a star: each node sees the root
    # norm / tree: both stores (split kernel, combine) in bf16; plain: every config and dtype
    fewer = {} if mode == "plain" else dict(names=("one", "split"), dtypes=(jnp.bfloat16,))
    _assert_out_dtype_rounds_once(args, G * R, True, **fewer, **kw)
    with pytest.raises(ValueError, match="out_dtype"):
        rope_attention_write(*args, n_heads=G * R, interpret=True, out_dtype=jnp.int32, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["smollm2", "llama3-8b"])
def test_gpu_out_dtype_is_the_rounded_float32_output(shape):
    H, G, d = GPU_SHAPES[shape]
    for B, T, S in ((1, 1, 300), (1, 5, 1024), (3, 8, 2048)):
        args = _fused_inputs(T + S, B, T, H, G, d, S, "bfloat16", np.linspace(0, S - T, B).astype(int).tolist())
        _assert_out_dtype_rounds_once(args, H, False)


def _assert_fused_steps_equal_verify(args, run):
    """T decode steps (T = 1, each on the caches the previous one wrote) vs one call over the T
    tokens: every output row and the final caches bit for bit."""
    qkv, k, v, cos, sin, start = args
    o_full, k_full, v_full = run(qkv, k, v, cos, sin, start)
    for t in range(qkv.shape[1]):
        o_t, k, v = run(qkv[:, t:t + 1], k, v, cos[:, t:t + 1], sin[:, t:t + 1], start + t)
        np.testing.assert_array_equal(np.asarray(o_t[:, 0]), np.asarray(o_full[:, t]), err_msg=f"row {t}")
    np.testing.assert_array_equal(np.asarray(k), np.asarray(k_full))
    np.testing.assert_array_equal(np.asarray(v), np.asarray(v_full))


def test_fused_entry_rejects_bad_inputs():
    f32, bf = (lambda *s: jnp.zeros(s, jnp.float32)), (lambda *s: jnp.zeros(s, jnp.bfloat16))
    start = jnp.zeros((1,), jnp.int32)
    with pytest.raises(ValueError, match="H\\+2G"):   # 6 + 2 * 2 rows expected, 9 given
        rope_attention_write(f32(1, 1, 9, 64), bf(1, 32, 2, 64), bf(1, 32, 2, 64), f32(1, 1, 64), f32(1, 1, 64),
                             start, n_heads=6)
    with pytest.raises(ValueError, match="queries"):
        rope_attention_write(f32(1, 33, 10, 64), bf(1, 32, 2, 64), bf(1, 32, 2, 64), f32(1, 33, 64),
                             f32(1, 33, 64), start, n_heads=6)
    with pytest.raises(ValueError, match="dtype"):
        rope_attention_write(f32(1, 1, 10, 64), f32(1, 32, 2, 64), f32(1, 32, 2, 64), f32(1, 1, 64),
                             f32(1, 1, 64), start, n_heads=6)


# ---------------------------------------------------------------- CPU: config, geometry, errors
@pytest.mark.parametrize("kw,msg", [({"block_m": 48}, "block_m"), ({"block_m": 8}, "block_m"),
                                    ({"block_k": 100}, "block_k"), ({"block_k": 512}, "block_k"),
                                    ({"split_blocks": 0}, "split_blocks"), ({"split_blocks": 1.5}, "split_blocks"),
                                    ({"num_warps": 3}, "num_warps"), ({"num_stages": 0}, "num_stages")])
def test_tuning_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        TuningConfig(**kw)


def test_split_geometry_and_default_config():
    assert split_geometry(200, SPLIT) == (4, 64)          # boundaries at multiples of 64 keys
    assert split_geometry(2048, ONE) == (1, 2048) and split_geometry(2049, ONE) == (2, 2048)
    assert packed_rows(3, 64) == 64 and packed_rows(4, 32) == 64 and packed_rows(8, 64) == 128
    assert default_config(1, 3, 3, 64) == TuningConfig(block_m=64, block_k=64, split_blocks=1)  # SmolLM2 B=1
    assert default_config(8, 3, 3, 64).split_blocks == 1                                          # SmolLM2 B=8
    assert default_config(1, 8, 1, 128).block_m == 16 and default_config(8, 8, 4, 128).split_blocks == 2


def test_entry_rejects_bad_inputs():
    bf = lambda *s: jnp.zeros(s, jnp.bfloat16)
    pos = lambda B, T: jnp.zeros((B, T), jnp.int32)
    with pytest.raises(ValueError, match="queries"):
        decode_attention(bf(1, WIDE_QUERIES + 1, 4, 64), bf(1, 32, 2, 64), bf(1, 32, 2, 64), pos(1, 33))
    with pytest.raises(ValueError, match="dtype"):
        decode_attention(jnp.zeros((1, 1, 4, 64)), bf(1, 32, 2, 64), bf(1, 32, 2, 64), pos(1, 1))
    with pytest.raises(ValueError, match="H % G"):
        decode_attention(bf(1, 1, 5, 64), bf(1, 32, 2, 64), bf(1, 32, 2, 64), pos(1, 1))


# ---------------------------------------------------------------- CPU: lowering for CUDA, dispatch
@pytest.mark.parametrize("shape", [(1, 1, 9, 3, 64, 512), (8, 9, 32, 8, 128, 2048), (2, 16, 8, 1, 128, 300),
                                   (1, 5, 16, 2, 64, 77)])
@pytest.mark.parametrize("name", CONFIGS)
def test_lowers_for_cuda(shape, name):
    """Lowers to Triton IR for an H200 (lowering rules, power-of-two tiles); PTX is built on GPU only."""
    B, T, H, G, d, S = shape
    q, kv = jax.ShapeDtypeStruct((B, T, H, d), jnp.bfloat16), jax.ShapeDtypeStruct((B, S, G, d), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((B, T), jnp.int32)
    h200 = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    f = lambda q, k, v, p: decode_attention(q, k, v, p, config=CONFIGS[name])
    with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(
            mesh_lib.AbstractMesh((1,), ("x",), abstract_device=h200)):
        warnings.simplefilter("ignore", DeprecationWarning)
        text = jax.jit(f).trace(q, kv, kv, pos).lower(lowering_platforms=("cuda",)).as_text()
    n_splits = split_geometry(S, CONFIGS[name] or default_config(B, G, H // G, d))[0]
    assert text.count("xla.gpu.triton") == (1 if n_splits == 1 else 2)


@pytest.mark.parametrize("shape", [(1, 1, 9, 3, 64, 512), (8, 9, 32, 8, 128, 2048), (2, 16, 8, 1, 128, 300),
                                   (1, 5, 6, 2, 256, 300)])
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("norm_dim", [0, 576])
def test_fused_lowers_for_cuda(shape, name, norm_dim):
    """The fused entry (also in norm mode) lowers to Triton IR for an H200, its caches aliased to outputs
    (in place)."""
    B, T, H, G, d, S = shape
    qkv = jax.ShapeDtypeStruct((B, T, H + 2 * G + (norm_dim > 0), d), jnp.float32)
    kv = jax.ShapeDtypeStruct((B, S, G, d), jnp.bfloat16)
    cs, start = jax.ShapeDtypeStruct((B, T, d), jnp.float32), jax.ShapeDtypeStruct((B,), jnp.int32)
    h200 = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    f = lambda *a: rope_attention_write(*a, n_heads=H, config=CONFIGS[name], norm_dim=norm_dim, norm_eps=1e-5)
    with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(
            mesh_lib.AbstractMesh((1,), ("x",), abstract_device=h200)):
        warnings.simplefilter("ignore", DeprecationWarning)
        text = jax.jit(f).trace(qkv, kv, kv, cs, cs, start).lower(lowering_platforms=("cuda",)).as_text()
    n_splits = split_geometry(S, CONFIGS[name] or default_config(B, G, H // G, d))[0]
    assert text.count("xla.gpu.triton") == (1 if n_splits == 1 else 2)
    assert "output_operand_aliases" in text


def _route(T, d=64):
    """Which kernel ``dispatch.attend`` picks (None: the reference), from the traced jaxpr."""
    declined = []

    def f(*args):
        out = dispatch.attend(*args)
        declined.append(out is None)
        return args[0] if out is None else out
    bf = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
    text = str(jax.make_jaxpr(f)(bf(1, T, 9, d), bf(1, 64, 3, d), bf(1, 64, 3, d),
                                 jax.ShapeDtypeStruct((1, T), jnp.int32)))
    if declined[0]:
        return None
    return "decode" if "decode_attention" in text else "fa3" if "flash_attention_fwd" in text else "?"


def test_dispatch_routes_by_query_count(monkeypatch):
    """Traced only (no kernel runs): T <= 32 -> decode kernel, longer -> FA3; env var restores the old
    routing; on a non-GPU backend the decode kernel never applies."""
    assert _route(1) is None                                       # this CPU host
    monkeypatch.setattr(dispatch, "_gpu_backend", lambda: True)
    assert [_route(T) for T in (1, 2, 16, 17, 32, 33)] == ["decode"] * 5 + ["fa3"]
    assert _route(1, d=256) is None and _route(5, d=256) == "fa3"   # d=256: FA3 only
    monkeypatch.setenv("SPECJAX_DECODE_KERNEL", "0")
    assert [_route(T) for T in (1, 2, 16, 33)] == [None, "fa3", "fa3", "fa3"]


def test_model_attention_routes_to_fused_kernel(monkeypatch):
    """Traced only: on Hopper the model's attention over T <= 32 new tokens is one fused kernel (no
    separate cache write), longer T and compute_dtype="float32" take RoPE + write + attend."""
    from specjax import attention
    monkeypatch.setattr(attention, "_use_kernels", lambda: True)
    monkeypatch.setattr(dispatch, "_gpu_backend", lambda: True)

    def text(T, compute_dtype="param"):
        f = lambda qkv, k, v, c, s, st: attention.attend_new_tokens(qkv, k, v, c, s, st, 6, compute_dtype)
        sds = jax.ShapeDtypeStruct
        cache = sds((1, 64, 2, 64), jnp.float32 if compute_dtype == "float32" else jnp.bfloat16)
        return str(jax.make_jaxpr(f)(sds((1, T, 10, 64), jnp.float32), cache, cache, sds((1, T, 64), jnp.float32),
                                     sds((1, T, 64), jnp.float32), sds((1,), jnp.int32)))
    one = text(1)
    assert "rope_attention_write" in one and "dynamic_update_slice" not in one
    assert "rope_attention_write" in text(32) and "rope_attention_write" not in text(33)
    assert "rope_attention_write" not in text(1, "float32")
    # RMSNorm folded in (a one-row decode step): one more head, the kernel in norm mode
    f = lambda qkv, k, v, c, s, st: attention.attend_new_tokens(qkv, k, v, c, s, st, 6, norm=(96, 1e-5))
    sds = jax.ShapeDtypeStruct
    cache = sds((1, 64, 2, 64), jnp.bfloat16)
    normed = str(jax.make_jaxpr(f)(sds((1, 1, 11, 64), jnp.float32), cache, cache, sds((1, 1, 64), jnp.float32),
                                   sds((1, 1, 64), jnp.float32), sds((1,), jnp.int32)))
    # the kernel's source: 11 rows (q|k|v heads + the sum-of-squares head), its scaling inside the kernel
    assert "a:Ref<default>{f32[11,64]}" in normed and "rsqrt" in normed and "dynamic_update_slice" not in normed


def test_model_and_head_ask_the_kernel_for_o_in_the_o_projections_dtype(monkeypatch):
    """Traced only: on Hopper the target's layers (one-row folded step and verify rows) and the EAGLE-3 head
    have the kernel store o in the o weight's dtype (the operand ``linear`` rounds it to; NOTES item 41)."""
    from specjax import attention, config, model
    from specjax.heads import eagle3
    monkeypatch.setattr(attention, "_use_kernels", lambda: True)
    monkeypatch.setattr(dispatch, "_gpu_backend", lambda: True)
    seen, original = [], dispatch.rope_attend_write

    def recording(*args, out_dtype=jnp.float32):
        seen.append(jnp.dtype(out_dtype))
        return original(*args, out_dtype=out_dtype)
    monkeypatch.setattr(dispatch, "rope_attend_write", recording)
    cfg = config.tiny(d_model=384, n_heads=6, n_kv_heads=2, ffn_dim=512, vocab_size=512, n_layers=2)
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    for T in (1, 5):
        cache = set_lengths(model.kv.init_cache(cfg, 1, 64, jnp.bfloat16), jnp.array([7], jnp.int32))
        jax.make_jaxpr(lambda t, c: model.forward(params, cfg, t, c)[0])(jnp.ones((1, T), jnp.int32), cache)
    assert seen == [jnp.dtype(jnp.bfloat16)] * 4, seen
    hcfg, hparams, embed = _eagle3_head(jnp.bfloat16)
    cache = set_lengths(eagle3.init_cache(hcfg, 2, 64, jnp.bfloat16), jnp.array([5, 9], jnp.int32))
    jax.make_jaxpr(lambda t, h, c: eagle3.step(hparams, hcfg, embed, t, h, c))(
        jnp.ones((2, 8), jnp.int32), jnp.ones((2, 8, 384), jnp.float32), cache)
    assert seen[-1] == jnp.dtype(jnp.bfloat16) and len(seen) == 5


def test_tree_rows_route_to_the_kernel_while_their_slots_fit_its_bits(monkeypatch):
    """Traced only: draft-tree rows (``tree=(visible, offset)``) take the fused kernel with their bits while
    the tree's slots number <= 32; a wider tree (the EAGLE-3 head's 63-node levels) takes the masked XLA path."""
    from specjax import attention
    monkeypatch.setattr(attention, "_use_kernels", lambda: True)
    monkeypatch.setattr(dispatch, "_gpu_backend", lambda: True)

    def text(T, W, offset):
        visible = np.tril(np.ones((T, W), bool), k=offset)
        f = lambda qkv, k, v, c, s, st: attention.attend_new_tokens(qkv, k, v, c, s, st, 6, tree=(visible, offset))
        sds = jax.ShapeDtypeStruct
        cache = sds((1, 64, 2, 64), jnp.bfloat16)
        return str(jax.make_jaxpr(f)(sds((1, T, 10, 64), jnp.float32), cache, cache, sds((1, T, 64), jnp.float32),
                                     sds((1, T, 64), jnp.float32), sds((1,), jnp.int32)))
    assert "rope_attention_write" in text(16, 16, 0) and "rope_attention_write" in text(8, 31, 23)
    assert "rope_attention_write" in text(32, 32, 0) and "rope_attention_write" in text(8, 32, 24)
    assert "rope_attention_write" not in text(8, 33, 25)
    assert dispatch.tree_bits(np.tril(np.ones((3, 3), bool))).tolist() == [1, 3, 7]
    wide = text(8, 63, 30)
    assert "rope_attention_write" not in wide and "dynamic_update_slice" in wide


@pytest.mark.parametrize("name", CONFIGS)
def test_fused_tree_lowers_for_cuda(name):
    """Tree mode (a 15-node tree's 16 rows, SmolLM2's heads) lowers to Triton IR for an H200."""
    B, T, H, G, d, S = 1, 16, 9, 3, 64, 1024
    qkv = jax.ShapeDtypeStruct((B, T, H + 2 * G, d), jnp.float32)
    kv = jax.ShapeDtypeStruct((B, S, G, d), jnp.bfloat16)
    cs, start = jax.ShapeDtypeStruct((B, T, d), jnp.float32), jax.ShapeDtypeStruct((B,), jnp.int32)
    bits = jax.ShapeDtypeStruct((T,), jnp.int32)
    h200 = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    f = lambda *a: rope_attention_write(*a[:6], n_heads=H, config=CONFIGS[name], tree_bits_T=a[6])
    with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(
            mesh_lib.AbstractMesh((1,), ("x",), abstract_device=h200)):
        warnings.simplefilter("ignore", DeprecationWarning)
        text = jax.jit(f).trace(qkv, kv, kv, cs, cs, start, bits).lower(lowering_platforms=("cuda",)).as_text()
    assert "xla.gpu.triton" in text


# ---------------------------------------------------------------- GPU
def _poison(*shapes):
    """Fill, then free, float32 device buffers of these sizes, so the kernels' outputs likely land on
    NaN-filled memory: an element that is read unwritten then shows up as NaN."""
    for s in shapes:
        jnp.full(s, jnp.nan, jnp.float32).block_until_ready().delete()


GPU_SHAPES = {"smollm2": (9, 3, 64), "llama3-8b": (32, 8, 128), "mha128": (8, 8, 128)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape,name", list(itertools.product(("bfloat16", "float16"), GPU_SHAPES,
                                                                    ("default", "one", "split"))))
def test_gpu_matches_float32_reference(dtype, shape, name):
    H, G, d = GPU_SHAPES[shape]
    for B, T, S in ((3, 1, 300), (3, 5, 300), (3, 16, 2048), (2, 1, 2048), (2, 32, 700)):
        q, k, v = _inputs(T + S + d, B, T, H, S, G, d, dtype)
        q_pos = _ragged_positions(B, T, S)
        cfg = CONFIGS[name] or default_config(B, G, H // G, d)
        rows = packed_rows(H // G, cfg.block_m, 32)
        _poison((B, T, H, d), (B, G, rows, d), (B, G, split_geometry(S, cfg)[0], rows, d))
        o = decode_attention(q, k, v, q_pos, config=cfg)
        _check_close(q, k, v, q_pos, o, tol=1e-2 if dtype == "bfloat16" else 2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,name,T", list(itertools.product(("smollm2", "llama3-8b"), CONFIGS, (3, 9, 16, 24))))
def test_gpu_t1_equals_verify_row_bitwise(shape, name, T):
    H, G, d = GPU_SHAPES[shape]
    B, S = 3, 1024
    q, k, v = _inputs(T, B, T, H, S, G, d, "bfloat16")
    q_pos = jnp.asarray([[60], [120], [S - T]], jnp.int32) + jnp.arange(T, dtype=jnp.int32)[None]
    _assert_t1_equals_verify_rows(q, k, v, q_pos, lambda *a: decode_attention(*a, config=CONFIGS[name]))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ("smollm2", "llama3-8b"))
def test_gpu_output_independent_of_cache_capacity(shape):
    """Default config: caches of 100, 1000 and 2048 slots give the same bits (SmolLM2's 64-key splits: 2, 16
    and 32 splits, the combine's loop run once, once and twice)."""
    H, G, d = GPU_SHAPES[shape]
    q, k, v = _inputs(12, 2, 9, H, 2048, G, d, "bfloat16")
    q_pos = jnp.asarray([[50], [90]], jnp.int32) + jnp.arange(9, dtype=jnp.int32)[None]
    run = lambda S: np.asarray(decode_attention(q, k[:, :S], v[:, :S], q_pos))
    ref = run(100)
    np.testing.assert_array_equal(run(1000), ref)
    np.testing.assert_array_equal(run(2048), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [2, 1])
def test_gpu_model_forward_kernels_vs_reference(monkeypatch, B):
    """A tiny random bf16 model: prefill (FA3), decode T=1 and verify T=5 (decode kernel) with the
    kernels on, against SPECJAX_ATTENTION=reference: close logits. B=1: the decode step is one row,
    where the kernel also applies the folded RMSNorm (norm mode)."""
    from specjax import cache as kv, config, model
    cfg = config.tiny(d_model=384, n_heads=6, n_kv_heads=2, ffn_dim=512, vocab_size=512)
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    params["layers"] = [dict(lp, attn_norm=(1 + 0.5 * jax.random.normal(jax.random.key(i), lp["attn_norm"].shape))
                             .astype(jnp.bfloat16)) for i, lp in enumerate(params["layers"])]  # norms that matter
    toks = jax.random.randint(jax.random.key(1), (B, 46), 3, cfg.vocab_size)
    steps = (toks[:, :40], toks[:, 40:41], toks[:, 41:46])

    def run():
        cache, out = kv.init_cache(cfg, B, 256, jnp.bfloat16), []
        for t in steps:
            logits, _, cache = model.forward(params, cfg, t, cache)
            out.append(np.asarray(logits))
        return out

    text = str(jax.make_jaxpr(lambda t, c: model.forward(params, cfg, t, c)[0])(
        steps[1], kv.init_cache(cfg, B, 256, jnp.bfloat16)))
    assert "decode_attention" in text, "the decode step did not dispatch to the decode kernel"
    assert ("f32[1,1,11,64]" in text) == (B == 1), "norm mode (a sum-of-squares head) iff one row"
    got = run()
    monkeypatch.setenv("SPECJAX_ATTENTION", "reference")
    ref = run()
    for g, r in zip(got, ref):
        assert np.linalg.norm(g - r) / np.linalg.norm(r) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape,name", list(itertools.product(("bfloat16",), GPU_SHAPES, CONFIGS))
                         + [("float16", shape, "default") for shape in GPU_SHAPES])
def test_gpu_fused_matches_reference(dtype, shape, name):
    H, G, d = GPU_SHAPES[shape]
    for B, T, S in ((3, 1, 300), (3, 5, 300), (3, 16, 2048), (2, 1, 2048)):
        args = _fused_inputs(T + S + d, B, T, H, G, d, S, dtype, np.linspace(0, S - T, B).astype(int).tolist())
        cfg = CONFIGS[name] or default_config(B, G, H // G, d)
        rows = packed_rows(H // G, cfg.block_m)
        _poison((B, T, H, d), (B, G, rows, d), (B, G, split_geometry(S, cfg)[0], rows, d))
        _check_fused(args, H, cfg, interpret=False, tol=1e-2 if dtype == "bfloat16" else 2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,name", list(itertools.product(GPU_SHAPES, ("split", "default"))))
def test_gpu_fused_norm_matches_reference(shape, name):
    """Norm mode (the RMSNorm folded in at one-row decode steps) on the GPU against the reference."""
    H, G, d = GPU_SHAPES[shape]
    for B, T, S in ((1, 1, 300), (1, 1, 2048), (3, 5, 300)):
        args = _with_sumsq_head(_fused_inputs(T + S + d, B, T, H, G, d, S, "bfloat16",
                                              np.linspace(0, S - T, B).astype(int).tolist()), H * d)
        cfg = CONFIGS[name] or default_config(B, G, H // G, d)
        rows = packed_rows(H // G, cfg.block_m)
        _poison((B, T, H, d), (B, G, rows, d), (B, G, split_geometry(S, cfg)[0], rows, d))
        o, k, v = rope_attention_write(*args, n_heads=H, config=cfg, norm_dim=H * d, norm_eps=1e-5)
        ref = rope_attention_write_reference(*args, n_heads=H, norm_dim=H * d, norm_eps=1e-5)
        for name_, a, b, tol in (("o", o, ref[0], 1e-2), ("k", k, ref[1], 1e-2), ("v", v, ref[2], 1e-2)):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            assert np.isfinite(a).all(), name_
            assert np.linalg.norm(a - b) / np.linalg.norm(b) < tol, (name_, B, T, S)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,name", list(itertools.product(("smollm2", "llama3-8b"), CONFIGS)))
def test_gpu_fused_t1_equals_verify_row_bitwise(shape, name):
    H, G, d = GPU_SHAPES[shape]
    B, T, S = 3, 9, 1024
    args = _fused_inputs(7, B, T, H, G, d, S, "bfloat16", [58, 120, S - T])
    _assert_fused_steps_equal_verify(args, lambda *a: rope_attention_write(*a, n_heads=H, config=CONFIGS[name]))


def _eagle3_head(dtype):
    from specjax import config
    from specjax.heads import eagle3
    target = config.tiny(d_model=384, n_heads=6, n_kv_heads=2, ffn_dim=512, vocab_size=512, n_layers=4)
    cfg = eagle3.Eagle3Config(target=target, draft_vocab_size=128)
    embed = (0.02 * jax.random.normal(jax.random.key(3), (512, 384))).astype(dtype)
    return cfg, eagle3.init_params(cfg, jax.random.key(2), dtype=dtype), embed


def test_eagle3_head_step_routes_to_fused_kernel(monkeypatch):
    """Traced only: on Hopper the EAGLE-3 head's chained (T=1) and update (T=8) steps run RoPE, the cache
    writes and attention as the target's layers do, in one kernel."""
    from specjax import attention
    from specjax.heads import eagle3
    monkeypatch.setattr(attention, "_use_kernels", lambda: True)
    monkeypatch.setattr(dispatch, "_gpu_backend", lambda: True)
    cfg, params, embed = _eagle3_head(jnp.bfloat16)
    for T in (1, 8):
        cache = set_lengths(eagle3.init_cache(cfg, 2, 64, jnp.bfloat16), jnp.array([5, 9], jnp.int32))
        text = str(jax.make_jaxpr(lambda t, h, c: eagle3.step(params, cfg, embed, t, h, c))(
            jnp.ones((2, T), jnp.int32), jnp.ones((2, T, 384), jnp.float32), cache))
        assert "rope_attention_write" in text and "dynamic_update_slice" not in text


@pytest.mark.gpu
def test_gpu_eagle3_head_step_kernel_vs_reference(monkeypatch):
    """The EAGLE-3 head's steps (an 8-row update, then chained 1-row steps) with the fused kernel against
    SPECJAX_ATTENTION=reference: close outputs and the same cache rows."""
    from specjax.heads import eagle3
    cfg, params, embed = _eagle3_head(jnp.bfloat16)
    toks = jax.random.randint(jax.random.key(4), (2, 12), 3, 512)
    feats = jax.random.normal(jax.random.key(5), (2, 12, 384), jnp.float32)

    def run():
        cache, out = set_lengths(eagle3.init_cache(cfg, 2, 256, jnp.bfloat16), jnp.array([40, 100], jnp.int32)), []
        for a, b in ((0, 8), (8, 9), (9, 10), (10, 11)):
            h, cache = eagle3.step(params, cfg, embed, toks[:, a:b], feats[:, a:b], cache)
            out.append(np.asarray(h))
        return out, np.asarray(cache.k[0], np.float32), np.asarray(cache.v[0], np.float32)

    text = str(jax.make_jaxpr(lambda t, h, c: eagle3.step(params, cfg, embed, t, h, c))(
        toks[:, :1], feats[:, :1], eagle3.init_cache(cfg, 2, 256, jnp.bfloat16)))
    assert "rope_attention_write" in text, "the head step did not dispatch to the fused kernel"
    got, k_got, v_got = run()
    monkeypatch.setenv("SPECJAX_ATTENTION", "reference")
    ref, k_ref, v_ref = run()
    for g, r in zip(got, ref):
        assert np.linalg.norm(g - r) / np.linalg.norm(r) < 1e-2
    for g, r in ((k_got, k_ref), (v_got, v_ref)):
        assert np.linalg.norm(g - r) / np.linalg.norm(r) < 1e-2
