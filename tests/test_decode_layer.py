"""The one-launch decoder layer (pallas_kernels/decode_layer.py) and its routing (specjax/layer_kernel.py).

CPU: the phase-by-phase form in the Pallas interpreter against the plain-JAX reference, the cache
write, CUDA lowering of the one-launch form, routing. GPU (@pytest.mark.gpu): the one-launch form
(grid barriers) bitwise equal to the phase-by-phase form, the counters re-armed, the model's decode
with the kernel against the XLA layers."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import mesh as mesh_lib

from pallas_kernels import decode_layer as dl
from specjax import cache as kv
from specjax import config, layer_kernel, model

pytestmark = pytest.mark.filterwarnings("ignore:.*Pallas Triton backend is deprecated")
SMOLLM2 = dict(D=576, H=9, G=3, d=64, F=1536)


def _inputs(D=64, H=6, G=2, d=16, F=96, S=40, pos=21, dtype=jnp.float32, bias=False, seed=0):
    ks = iter(jax.random.split(jax.random.key(seed), 16))
    w = lambda *s: (0.2 * jax.random.normal(next(ks), s, jnp.float32)).astype(dtype)
    lp = dict(attn_norm=1 + w(D), wqkv=w((H + 2 * G) * d, D), wo=w(D, H * d), mlp_norm=1 + w(D),
              w_gate_up=w(2 * F, D), w_down=w(D, F))
    if bias:
        lp["bqkv"] = w((H + 2 * G) * d)
    x = 2 * jax.random.normal(next(ks), (D,))
    ang = pos * 0.3 ** jnp.arange(d // 2)
    ang = jnp.concatenate([ang, ang])
    k, v = (jax.random.normal(next(ks), (1, S, G, d)).astype(dtype) for _ in range(2))
    return (lp, x, jnp.cos(ang), jnp.sin(ang), jnp.array([pos], jnp.int32), k, v), H


def _run(args, H, **kw):
    flags = jnp.zeros((dl.flags_size(kw.get("config")),), jnp.int32)
    return dl.decode_layer(*args, flags, n_heads=H, eps=1e-5, **kw)


def _close(out, ref, tol_rel):
    for name, o, r in zip(("x", "k", "v"), out, ref):
        o, r = np.asarray(o, np.float32), np.asarray(r, np.float32)
        assert o.shape == r.shape and np.isfinite(o).all(), name
        np.testing.assert_allclose(o, r, rtol=0, atol=tol_rel * (1 + np.abs(r).max()), err_msg=name)


# ---------------------------------------------------------------- CPU: Pallas interpreter
# Small configs cover: several passes per phase (2 programs), several splits and several key blocks per
# split, R = H / G = 3 (padded to 4), the first and the last slot, a bias (Qwen2).
CASES = [dict(cfg=dl.TuningConfig(num_programs=8, rows=4, block_keys=16), pos=21, bias=True),
         dict(cfg=dl.TuningConfig(num_programs=4, rows=2, block_keys=16), pos=39, bias=False),
         dict(cfg=dl.TuningConfig(num_programs=16, rows=4, block_keys=16), pos=0, bias=False, H=6, G=2),
         dict(cfg=dl.TuningConfig(num_programs=4, rows=8, block_keys=16), pos=33, bias=False, H=3, G=1)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_interpreter_matches_reference_fp32(case):
    c = dict(CASES[case])
    cfg = c.pop("cfg")
    args, H = _inputs(**c)
    z = dl.layer_dims(args[0], args[5], H, 1e-5, cfg)
    out = _run(args, H, config=cfg, phased=True, interpret=True)
    ref = dl.decode_layer_reference(*args, n_heads=H, eps=1e-5)
    _close(out[:3], ref, 1e-5)     # the same float32 arithmetic, summed in another order
    if case == 1:  # the coverage the case is for: several passes, splits, and blocks per split
        assert z.P < (z.H + 2 * z.G) * z.d // z.rq and z.spb > 1 and z.n_splits > 1, z


def test_interpreter_matches_reference_bf16():
    args, H = _inputs(dtype=jnp.bfloat16, pos=30, seed=3)
    cfg = dl.TuningConfig(num_programs=8, rows=4, block_keys=16)
    out = _run(args, H, config=cfg, phased=True, interpret=True)
    ref = dl.decode_layer_reference(*args, n_heads=H, eps=1e-5)
    # bf16 operands, float32 sums in another order: a product or a probability rounded to the other side
    # of a bf16 tie moves the float32 output by about one bf16 ulp of its operands
    _close(out[:3], ref, 2 ** -7)


def test_cache_write_touches_only_the_slot():
    args, H = _inputs(pos=17)
    out = _run(args, H, config=dl.TuningConfig(num_programs=8, rows=4, block_keys=16), phased=True,
               interpret=True)
    for new, old in ((out[1], args[5]), (out[2], args[6])):
        changed = np.any(np.asarray(new) != np.asarray(old), axis=(0, 2, 3))
        assert changed.nonzero()[0].tolist() == [17]


def test_config_and_unsupported_messages():
    with pytest.raises(ValueError, match="rows must be a power of two"):
        dl.TuningConfig(rows=6)
    with pytest.raises(ValueError, match="num_programs"):
        dl.TuningConfig(num_programs=0)
    args, H = _inputs()
    lp, x, *_, k, v = args
    assert dl.unsupported(lp, x.reshape(1, 1, -1), k, v, H, 1e-5) is None
    assert "one token" in dl.unsupported(lp, jnp.zeros((1, 2, 64)), k, v, H, 1e-5)
    big, _ = _inputs(D=4096, H=32, G=8, d=128, F=14336, S=8)
    assert "too large" in dl.unsupported(big[0], jnp.zeros((1, 1, 4096)), big[5], big[6], 32, 1e-5)
    with pytest.raises(ValueError, match="too large"):
        _run(big, 32)


def _h200_lowering(f, *args):
    h200 = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(
            mesh_lib.AbstractMesh((1,), ("x",), abstract_device=h200)):
        warnings.simplefilter("ignore", DeprecationWarning)
        return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("dtype,bias", [(jnp.bfloat16, False), (jnp.float16, True), (jnp.float32, False)])
def test_lowers_for_cuda_smollm2_shape(dtype, bias):
    """The one-launch form (barriers, atomics, spin loop) lowers to Triton for the SmolLM2 shape."""
    args, H = _inputs(**SMOLLM2, S=512, pos=300, dtype=dtype, bias=bias)
    flags = jnp.zeros((128,), jnp.int32)
    text = _h200_lowering(lambda *a: dl.decode_layer(*a, n_heads=H, eps=1e-5, config=dl.TuningConfig()), *args, flags)
    assert text.count("decode_layer_01234") >= 1


def test_model_routes_one_token_to_the_layer_kernel(monkeypatch):
    """With a Hopper device, a B * T = 1 cached forward runs one kernel per layer; not with
    SPECJAX_LAYER_KERNEL=0, nor with compute_dtype="float32" (the kernel rounds operands to the weights')."""
    monkeypatch.setattr(layer_kernel, "_hopper", lambda: True)
    cfg = config.ModelConfig(vocab_size=256, d_model=576, n_layers=2, n_heads=9, n_kv_heads=3, ffn_dim=1536)
    p = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    tok = jax.ShapeDtypeStruct((1, 1), jnp.int32)

    c = kv.init_cache(cfg, 1, 64, jnp.bfloat16)
    assert "decode_layer_01234" in _h200_lowering(lambda p, t, c: model.forward(p, cfg, t, c), p, tok, c)
    x1, x2 = jnp.zeros((1, 1, 576)), jnp.zeros((1, 2, 576))
    applies = lambda cfg, x: layer_kernel.applies(p["layers"][0], cfg, x, c.k[0], c.v[0])
    assert applies(cfg, x1) and not applies(cfg, x2)
    assert not applies(config.ModelConfig(**{**cfg.__dict__, "compute_dtype": "float32"}), x1)
    monkeypatch.setenv("SPECJAX_LAYER_KERNEL", "0")
    assert not applies(cfg, x1)


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("pos", [0, 63, 64, 300, 511])
def test_gpu_one_launch_equals_phased_bitwise_and_reference(dtype, pos):
    args, H = _inputs(**SMOLLM2, S=512, pos=pos, dtype=dtype, seed=pos)
    out = _run(args, H)
    phased = _run(args, H, phased=True)
    for o, p in zip(out[:3], phased[:3]):
        np.testing.assert_array_equal(np.asarray(o), np.asarray(p))
    np.testing.assert_array_equal(np.asarray(out[3])[:dl.default_config().num_programs], 4)  # one per barrier
    with jax.default_matmul_precision("highest"):
        ref = jax.jit(lambda *a: dl.decode_layer_reference(*a, n_heads=H, eps=1e-5))(*args)
    _close(out[:3], ref, 1e-5 if dtype == jnp.float32 else 2 ** -7)


@pytest.mark.gpu
def test_gpu_chained_layers_thread_the_flags():
    """30 layers in one jit, one flag array threaded through (as model.forward does)."""
    args, H = _inputs(**SMOLLM2, S=512, pos=100, dtype=jnp.bfloat16)
    lp, x, cos, sin, pos, k, v = args

    def chain(x, k, v, flags, phased):
        for _ in range(30):
            x, k, v, flags = dl.decode_layer(lp, 0.1 * x, cos, sin, pos, k, v, flags, n_heads=H, eps=1e-5,
                                             phased=phased)
        return x, flags
    zeros = jnp.zeros((dl.flags_size(),), jnp.int32)
    fast = jax.jit(lambda *a: chain(*a, False))(x, k, v, zeros)
    slow = jax.jit(lambda *a: chain(*a, True))(x, k, v, zeros)
    np.testing.assert_array_equal(np.asarray(fast[0]), np.asarray(slow[0]))
    np.testing.assert_array_equal(np.asarray(fast[1])[:dl.default_config().num_programs], 4 * 30)


@pytest.mark.gpu
def test_gpu_model_decode_with_layer_kernel_matches_xla_layers(monkeypatch):
    """Greedy decode of a random fp32 SmolLM2-shaped model (4 layers): the kernel path's logits at every
    step against the XLA layers' (highest matmul precision)."""
    cfg = config.ModelConfig(vocab_size=512, d_model=576, n_layers=4, n_heads=9, n_kv_heads=3, ffn_dim=1536)
    p = model.init_params(cfg, jax.random.key(1), dtype=jnp.float32)
    prompt = jax.random.randint(jax.random.key(2), (1, 37), 0, 512)

    def run():
        jax.clear_caches()
        c = kv.init_cache(cfg, 1, 128, jnp.float32)
        logits, _, c = model.forward(p, cfg, prompt, c)
        tok, out = jnp.argmax(logits[:, -1], -1)[:, None], []
        step = jax.jit(lambda t, c: model.forward(p, cfg, t, c))
        for _ in range(16):
            logits, _, c = step(tok, c)
            out.append(np.asarray(logits[0, 0]))
            tok = jnp.argmax(logits[:, -1], -1)[:, None]
        return np.stack(out)
    with jax.default_matmul_precision("highest"):
        monkeypatch.setenv("SPECJAX_LAYER_KERNEL", "1")
        fast = run()
        monkeypatch.setenv("SPECJAX_LAYER_KERNEL", "0")
        slow = run()
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-4 * (1 + np.abs(slow).max()))
