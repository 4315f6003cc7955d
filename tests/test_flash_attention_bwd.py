"""FA3 backward kernels (dK/dV, dQ): Mosaic GPU interpreter and CUDA lowering on CPU; real runs under
@pytest.mark.gpu. The reference is autodiff of the forward's float32 reference."""

import itertools

import jax
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import get_races

from pallas_kernels.flash_attention import (TuningConfig, default_config, flash_attention_fwd, flash_attention_reference,
                                            key_end)
from pallas_kernels.flash_attention_bwd import (BWD_TUNED, HEAD_DIMS, BwdConfig, _q_block_ranges, default_bwd_config,
                                                flash_attention_bwd, flash_attention_bwd_reference)
from pallas_kernels.flash_attention_vjp import attention_bwd_blocked, flash_attention

INTERP = BwdConfig(interpretable=True)
FUSED_64 = BwdConfig(interpretable=True, fused_dq=True, block_q_dkv=128, stages_dkv=1)   # dQ parts by row halves
FUSED_128 = BwdConfig(interpretable=True, fused_dq=True)                                   # by column halves
FWD_INTERP = TuningConfig(block_kv=64, interpretable=True)


def _inputs(seed, B, T, H, S, G, d, dtype):
    kq, kk, kv, kd = jax.random.split(jax.random.key(seed), 4)
    return (jax.random.normal(kq, (B, T, H, d), dtype), jax.random.normal(kk, (B, S, G, d), dtype),
            jax.random.normal(kv, (B, S, G, d), dtype), jax.random.normal(kd, (B, T, H, d), dtype))


def _kend(mode, B, T, S, seed=0):
    """Every mask of ``key_end``; "padded": per-sequence key lengths and query rows past ``q_lens``
    that see nothing, inside a 64-row block (a block whose rows partly see keys)."""
    rng = np.random.default_rng(seed)
    kv_lens = jnp.asarray(rng.integers(max(T, S // 2), S + 1, B), jnp.int32)
    if mode == "positions":
        q_pos = (kv_lens - T)[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
        return key_end(B, T, S, causal=mode, q_pos_BT=q_pos)
    if mode == "padded":
        q_lens = jnp.asarray(rng.integers(1, T + 1, B), jnp.int32).at[0].set(T - 37)
        return key_end(B, T, S, causal="bottom_right", kv_lens_B=kv_lens, q_lens_B=q_lens)
    return key_end(B, T, S, causal=mode, kv_lens_B=kv_lens)


def _check_grads(got, ref, tol):
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        g, r = np.asarray(g.astype(jnp.float32)), np.asarray(r)
        assert g.shape == r.shape, (name, g.shape, r.shape)
        assert np.isfinite(g).all(), f"{name} has NaN/inf (an unwritten or bad element)"
        rel = np.linalg.norm(g - r) / np.linalg.norm(r)
        assert rel < tol, f"{name}: relative error {rel:.2e} >= {tol}"


def _run(shape, mode, cfg, dtype=jnp.bfloat16, fwd_cfg=None, seed=3, interpret=True, kernel_fwd=False):
    """The backward kernels on random inputs of ``shape`` = (B, T, H, S, G, d) with ``mode``'s mask. On the GPU
    O and LSE come from the forward kernel; in the interpreter from the forward's reference (O in the inputs'
    dtype), which the forward's own tests hold the kernel's O and LSE to, unless ``kernel_fwd``: interpreting the
    forward too took 30-60 % of such a test (benchmarks/NOTES.md item 60)."""
    B, T, H, S, G, d = shape
    q, k, v, do = _inputs(seed, *shape, dtype)
    kend = _kend(mode, B, T, S, seed)
    if interpret:
        with plgpu.force_gpu_interpret_mode():
            o, lse = (flash_attention_fwd(q, k, v, kend, config=fwd_cfg or FWD_INTERP) if kernel_fwd
                      else flash_attention_reference(q, k, v, kend))
            got = flash_attention_bwd(q, k, v, o, lse, do, kend, config=cfg)
    else:
        o, lse = flash_attention_fwd(q, k, v, kend, config=fwd_cfg)
        got = flash_attention_bwd(q, k, v, o, lse, do, kend, config=cfg)
    return (q, k, v, do, kend, o, lse), got


# ---------------------------------------------------------------- CPU: the interpreter
@pytest.mark.parametrize("mode,shape,cfg", [
    ("none", (1, 130, 2, 200, 1, 64), INTERP),
    ("top_left", (1, 200, 2, 200, 1, 128), BwdConfig(interpretable=True, block_kv_dq=128)),
    ("bottom_right", (2, 77, 4, 301, 2, 64), INTERP),                         # GQA, odd lengths
    ("positions", (1, 150, 3, 190, 1, 64), BwdConfig(interpretable=True, stages_dkv=1, stages_dq=3)),
    ("padded", (2, 140, 2, 260, 2, 64), BwdConfig(interpretable=True, block_q_dkv=128, stages_dkv=1,
                                                  block_kv_dq=128)),             # rows that see nothing
    ("none", (1, 5, 2, 9, 1, 64), INTERP),                                    # shorter than one block
    ("top_left", (1, 300, 2, 300, 1, 64), BwdConfig(interpretable=True, block_q_dkv=128)),  # 128-row dK/dV steps
    ("bottom_right", (2, 77, 4, 150, 2, 256), default_bwd_config(256, interpretable=True)),  # dV, then dK: 2 passes
    ("top_left", (1, 300, 2, 300, 1, 64), FUSED_64),                          # one kernel: dQ from dK/dV's steps
    ("bottom_right", (2, 77, 4, 150, 2, 128), FUSED_128),                     # ... by column halves, GQA
])
def test_interpreter_matches_grad_of_reference(mode, shape, cfg):
    """Tiles of one to four steps in both kernels, ring depths 1 to 3, dK/dV steps of 64 and 128 query
    rows, every mask: against autodiff of the float32 reference, and against the blocked pure-JAX
    backward on the same O and LSE."""
    (q, k, v, do, kend, o, lse), got = _run(shape, mode, cfg)
    _check_grads(got, flash_attention_bwd_reference(q, k, v, do, kend), tol=1e-2)
    blocked = attention_bwd_blocked(q, k, v, o, lse, do, kend, scale=1 / np.sqrt(shape[-1]))
    _check_grads(got, [b.astype(jnp.float32) for b in blocked], tol=1e-2)


def test_interpreter_backward_takes_the_interpreted_forwards_o_and_lse():
    """The pipeline of ``flash_attention``'s custom VJP in the interpreter: the forward kernel's O and LSE (rows that
    see no key among them) into both backward kernels."""
    (q, k, v, do, kend, _, _), got = _run((2, 80, 2, 130, 1, 64), "padded", INTERP, kernel_fwd=True)
    _check_grads(got, flash_attention_bwd_reference(q, k, v, do, kend), tol=1e-2)


@pytest.mark.parametrize("cfg", [INTERP, default_bwd_config(64, interpretable=True), FUSED_64],
                         ids=["q64-64", "hd64-default", "fused"])
def test_interpreter_finds_no_races(cfg):
    shape = (1, 130, 2, 200, 1, 64)
    B, T, H, S, G, d = shape
    q, k, v, do = _inputs(5, *shape, jnp.float16)
    kend = _kend("top_left", B, T, S)
    o, lse = flash_attention_reference(q, k, v, kend)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams(detect_races=True)):
        got = flash_attention_bwd(q, k, v, o, lse, do, kend, config=cfg)
        assert not get_races().races_found
    _check_grads(got, flash_attention_bwd_reference(q, k, v, do, kend), tol=2e-3)


def test_custom_vjp_uses_the_kernels_at_every_head_dim():
    """``flash_attention``'s backward is the kernels' jitted entry at hd 64, 128 and 256 (seen in the
    traced jaxpr), never the blocked pure-JAX backward's scan."""
    def grad_jaxpr(d):
        B, T, H, S, G = 1, 64, 2, 64, 1
        q, k, v, do = _inputs(1, B, T, H, S, G, d, jnp.bfloat16)
        kend = key_end(B, T, S, causal="top_left")
        f = lambda q, k, v: jnp.sum(flash_attention(q, k, v, kend, None, FWD_INTERP).astype(jnp.float32))
        return str(jax.make_jaxpr(jax.grad(f, (0, 1, 2)))(q, k, v))
    for d in (64, 128, 256):
        jaxpr = grad_jaxpr(d)
        assert "flash_attention_bwd" in jaxpr and "scan" not in jaxpr, d


def test_q_block_ranges_cover_exactly_the_blocks_that_see_the_tile():
    B, T, S = 3, 448, 512
    kend = jnp.stack([key_end(1, T, S, causal="top_left")[0],
                      key_end(1, T, S, causal="none")[0],
                      key_end(1, T, S, causal="bottom_right", kv_lens_B=[300], q_lens_B=[200])[0]])
    for block_q in (64, 128):
        kend_p = jnp.pad(kend, ((0, 0), (0, -T % block_q)))   # padded rows see nothing, as in the entry
        qlo, qhi = map(np.asarray, _q_block_ranges(kend_p, 4, block_q))
        sees = (np.asarray(kend_p).reshape(B, -1, block_q).max(-1)[:, None, :]
                > 128 * np.arange(4)[None, :, None])
        for b, t in itertools.product(range(B), range(4)):
            idx = np.flatnonzero(sees[b, t])
            assert (qlo[b, t], qhi[b, t]) == ((idx[0], idx[-1] + 1) if idx.size else (0, 0)), (b, t, block_q)
        if block_q == 64:
            assert list(qlo[0]) == [0, 2, 4, 6] and list(qhi[0]) == [7] * 4   # causal: the diagonal onwards
            assert list(qhi[2]) == [4, 4, 4, 0]   # rows past q_len 200 (block 4 on) see nothing; keys >= 300 unseen
        else:
            assert list(qlo[0]) == [0, 1, 2, 3] and list(qhi[0]) == [4] * 4
            assert list(qhi[2]) == [2, 2, 2, 0]


# ---------------------------------------------------------------- CPU: lowering for CUDA, validation
def _cuda_text(d, dtype, cfg=None):
    """The backward's StableHLO lowered for CUDA on this host, GQA and odd lengths."""
    B, T, H, S, G = 2, 1000, 8, 777, 2
    q = jax.ShapeDtypeStruct((B, T, H, d), jnp.dtype(dtype))
    k = jax.ShapeDtypeStruct((B, S, G, d), jnp.dtype(dtype))
    lse, kend = jax.ShapeDtypeStruct((B, H, T), jnp.float32), jax.ShapeDtypeStruct((B, T), jnp.int32)
    return jax.jit(lambda *a: flash_attention_bwd(*a, config=cfg)).trace(q, k, k, q, lse, q, kend).lower(
        lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("d,dtype,cfg", [
    pytest.param(d, dt, c, id=f"hd{d}-{dt}-{c.block_kv_dq}-{c.stages_dkv}{c.stages_dq}")
    for d, dt, c in itertools.product((64, 128), ("bfloat16", "float16"),
                                      (BwdConfig(), BwdConfig(block_kv_dq=128), BwdConfig(stages_dkv=3, stages_dq=1)))]
    + [pytest.param(64, dt, c, id=f"hd64-{dt}-q{c.block_q_dkv}-{c.block_kv_dq}-{c.stages_dkv}{c.stages_dq}")
       for dt in ("bfloat16", "float16")
       for c in (BwdConfig(block_q_dkv=128), BwdConfig(block_q_dkv=128, block_kv_dq=128, stages_dkv=3))])
def test_lowers_for_cuda(d, dtype, cfg):
    """Both kernels lower for CUDA on this host (shared memory, layouts, dtypes), GQA and odd lengths."""
    text = _cuda_text(d, dtype, cfg)
    assert text.count("custom_call @mosaic_gpu") == 2   # the dK/dV and the dQ kernel
    # named, so profiles and compute-sanitizer's --kernel-name filter tell them apart
    assert "fa3_bwd_dkv_mosaic_gpu" in text and "fa3_bwd_dq_mosaic_gpu" in text


@pytest.mark.parametrize("d,cfg", [(64, BwdConfig(fused_dq=True, block_q_dkv=128)),
                                   (64, BwdConfig(fused_dq=True, block_q_dkv=128, stages_dkv=1)),
                                   (128, BwdConfig(fused_dq=True)), (128, BwdConfig(fused_dq=True, stages_dkv=1))])
@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
def test_lowers_for_cuda_as_one_kernel(d, cfg, dtype):
    """``fused_dq``: one launch (``fa3_bwd``) forms dK, dV and dQ."""
    text = _cuda_text(d, dtype, cfg)
    assert text.count("custom_call @mosaic_gpu") == 1 and "fa3_bwd_mosaic_gpu" in text


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
def test_lowers_for_cuda_in_two_passes_at_hd_256(dtype):
    """At hd 256 the dK/dV kernel runs twice (dV, then dK) beside the dQ kernel, in one stage each."""
    text = _cuda_text(256, dtype)
    assert text.count("custom_call @mosaic_gpu") == 3
    assert all(f"fa3_bwd_{n}_mosaic_gpu" in text for n in ("dv", "dk", "dq")) and "fa3_bwd_dkv" not in text


@pytest.mark.parametrize("d,cfg", [(64, BwdConfig()), (128, BwdConfig(block_kv_dq=128, stages_dkv=3)),
                                   (128, BwdConfig(interpretable=True, stages_dq=1)),
                                   (64, BwdConfig(block_q_dkv=128, stages_dkv=3)),
                                   (64, BwdConfig(interpretable=True, block_q_dkv=128)),
                                   (256, default_bwd_config(256)), (256, BwdConfig(stages_dkv=1, stages_dq=1)),
                                   (256, default_bwd_config(256, interpretable=True)),
                                   (64, BwdConfig(fused_dq=True, block_q_dkv=128)), (128, BwdConfig(fused_dq=True)),
                                   (128, BwdConfig(fused_dq=True, interpretable=True))])
def test_smem_bytes_is_what_mosaic_allocates(d, cfg):
    """``smem_bytes`` (behind ``check_head_dim``'s error) equals Mosaic GPU's own count for both kernels
    (at hd 256 each of the two dK/dV passes; ``smem_bytes`` reports the larger): lowering under a limit one
    byte below it fails and names exactly that many bytes."""
    from jax.experimental.mosaic.gpu import core as mgpu_core
    from pallas_kernels.flash_attention_bwd import _build_dkv, _build_dq
    B, T, H, S, G = 1, 512, 2, 512, 1
    q, k = jax.ShapeDtypeStruct((B, T, H, d), jnp.bfloat16), jax.ShapeDtypeStruct((B, S, G, d), jnp.bfloat16)
    stats, ints = jax.ShapeDtypeStruct((B, H, 3, T), jnp.float32), jax.ShapeDtypeStruct((B, T), jnp.int32)
    if cfg.fused_dq:   # one launch, adding dQ into a float32 ref (the interpretable form: a part per kv tile)
        fused = _build_dkv(B, H, S, G, d, jnp.bfloat16, cfg, 0.1, "dkdvdq")
        acc = ((S // 128,) if cfg.interpretable else ()) + (B, T, H, d)
        fn = lambda *a: fused(*a, jax.new_ref(jnp.zeros(acc, jnp.float32)))
        calls = [(fn, (q, k, k, q, stats, ints, ints), cfg._dkv_smem_bytes("dkdvdq", d))]
        assert cfg.smem_bytes(d) == (calls[0][2], 0)
    else:
        passes = ("dv", "dk") if d == 256 else ("dkdv",)
        calls = [(_build_dkv(B, H, S, G, d, jnp.bfloat16, cfg, 0.1, g), (q, k, k, q, stats, ints, ints),
                  cfg._dkv_smem_bytes(g, d)) for g in passes]
        calls.append((_build_dq(B, T, H, S, G, d, jnp.bfloat16, cfg, 0.1), (q, k, k, q, stats, ints, ints, ints),
                      cfg.smem_bytes(d)[1]))
        assert cfg.smem_bytes(d)[0] == max(want for _, _, want in calls[:-1])
    for fn, args, want in calls:
        with mgpu_core.artificial_shared_memory_limit(want - 1), pytest.raises(ValueError) as err:
            jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        assert f"smem_bytes={want} " in str(err.value), str(err.value)


def test_default_bwd_config_follows_the_tuned_table():
    assert set(BWD_TUNED) == set(HEAD_DIMS)
    assert default_bwd_config(64) == BwdConfig(block_q_dkv=128, block_kv_dq=128)
    assert default_bwd_config(128) == BwdConfig()
    assert default_bwd_config(256) == BwdConfig(stages_dkv=1, stages_dq=1, stages_dv=2)
    assert default_bwd_config(64, interpretable=True) == BwdConfig(block_q_dkv=128, block_kv_dq=128, interpretable=True)
    for d in HEAD_DIMS:   # every pick fits its head dim's registers and shared memory
        default_bwd_config(d).check_head_dim(d)


def test_config_and_input_validation():
    with pytest.raises(ValueError, match="block_kv_dq"):
        BwdConfig(block_kv_dq=96)
    with pytest.raises(ValueError, match="stages_dkv"):
        BwdConfig(stages_dkv=0)
    with pytest.raises(ValueError, match="stages_dq"):
        BwdConfig(stages_dq=True)
    with pytest.raises(ValueError, match="stages_dv"):
        BwdConfig(stages_dv=5)
    with pytest.raises(ValueError, match="head dims"):
        BwdConfig().check_head_dim(96)
    with pytest.raises(ValueError, match="shared memory"):
        BwdConfig().check_head_dim(256)   # two-stage rings at hd 256
    with pytest.raises(ValueError, match="shared memory"):
        BwdConfig(block_kv_dq=128, stages_dq=4).check_head_dim(128)
    with pytest.raises(ValueError, match="block_q_dkv"):
        BwdConfig(block_q_dkv=96)
    with pytest.raises(ValueError, match="256 float32 registers"):
        BwdConfig(block_q_dkv=128).check_head_dim(128)
    with pytest.raises(ValueError, match="block_q_dkv=128 is too many rows at head dim 256"):
        BwdConfig(block_q_dkv=128, stages_dkv=1, stages_dq=1).check_head_dim(256)
    with pytest.raises(ValueError, match="block_kv_dq=128 is too many keys at head dim 256"):
        BwdConfig(block_kv_dq=128, stages_dkv=1, stages_dq=1).check_head_dim(256)
    with pytest.raises(ValueError, match="fused_dq must be True or False"):
        BwdConfig(fused_dq=1)
    with pytest.raises(ValueError, match="fused_dq takes head dims 64"):
        BwdConfig(fused_dq=True).check_head_dim(64)   # 64-row steps at hd 64: no 64-aligned half of the dQ tile
    with pytest.raises(ValueError, match="fused_dq takes head dims 64"):
        BwdConfig(fused_dq=True, stages_dkv=1, stages_dq=1).check_head_dim(256)
    q, k, v, do = _inputs(0, 1, 64, 2, 64, 1, 64, jnp.bfloat16)
    kend = key_end(1, 64, 64)
    with pytest.raises(ValueError, match="lse"):
        flash_attention_bwd(q, k, v, q, jnp.zeros((1, 2, 63)), do, kend)


# ---------------------------------------------------------------- GPU
REP = {64: 1, 128: 4, 256: 2}   # GQA ratio H / G per head dim


def _poison(*shapes):
    """Fill, then free, device buffers of the outputs' sizes, so that an element the kernels fail to
    write likely shows up as NaN."""
    for s in shapes:
        jnp.full(s, jnp.nan, jnp.float32).block_until_ready().delete()


MODES = ("none", "top_left", "bottom_right", "positions", "padded")
GPU_CASES = ([("bfloat16" if i % 2 else "float16", hd, mode, BwdConfig()) for hd in (64, 128) for i in (0, 1)
              for mode in MODES]
             + [("bfloat16", hd, mode, c) for hd in (64, 128) for mode in ("top_left", "padded")
                for c in (BwdConfig(block_kv_dq=128), BwdConfig(stages_dkv=3, stages_dq=1))]
             + [(dtype, 64, mode, c) for dtype in ("bfloat16", "float16") for mode in MODES
                for c in (BwdConfig(block_q_dkv=128), BwdConfig(block_q_dkv=128, block_kv_dq=128))]
             + [(dtype, 256, mode, default_bwd_config(256)) for dtype in ("bfloat16", "float16")
                for mode in MODES]    # two dK/dV passes
             + [(dtype, hd, mode, c) for dtype in ("bfloat16", "float16") for mode in MODES
                for hd, c in ((64, BwdConfig(fused_dq=True, block_q_dkv=128, block_kv_dq=128)),
                              (128, BwdConfig(fused_dq=True)))])   # one kernel, dQ reduced by TMA


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,hd,mode,cfg", GPU_CASES, ids=lambda x: (
    f"q{x.block_q_dkv}-{x.block_kv_dq}-{x.stages_dkv}{x.stages_dq}{'-fused' * x.fused_dq}"
    if isinstance(x, BwdConfig) else None))
def test_gpu_matches_float32_reference(dtype, hd, mode, cfg):
    """Register A operands (the interpreter's staged SMEM form is not this code): GQA, odd lengths,
    every mask, outputs poisoned first, against autodiff of the float32 reference."""
    G = 2
    H = G * REP[hd]
    for B, T, S in ((2, 1000, 1000), (3, 77, 1531), (1, 2048, 2048)):
        if mode == "top_left" and T != S:
            continue
        _poison((B, T, H, hd), (B, S, G, hd), (B, S, G, hd))
        (q, k, v, do, kend, _, _), got = _run((B, T, H, S, G, hd), mode, cfg, jnp.dtype(dtype), seed=T,
                                              fwd_cfg=default_config(hd, S, mode != "none"), interpret=False)
        _check_grads(got, flash_attention_bwd_reference(q, k, v, do, kend), tol=1e-2 if dtype == "bfloat16" else 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("hd", (64, 128, 256))
def test_gpu_custom_vjp_matches_grad_of_reference(hd):
    """``jax.grad`` through ``flash_attention`` (the kernels at every head dim; two dK/dV passes at 256)."""
    B, T, H, S, G = 2, 300, 4, 700, 2
    q, k, v, do = _inputs(9, B, T, H, S, G, hd, jnp.bfloat16)
    kend = key_end(B, T, S, causal="bottom_right", kv_lens_B=[700, 450], q_lens_B=[300, 120])
    cfg = default_config(hd, S, causal=True)
    got = jax.grad(lambda q, k, v: jnp.sum(flash_attention(q, k, v, kend, None, cfg).astype(jnp.float32)
                                           * do.astype(jnp.float32)), (0, 1, 2))(q, k, v)
    _check_grads(got, flash_attention_bwd_reference(q, k, v, do, kend), tol=2e-2)
