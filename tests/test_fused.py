"""Fused decode/verify kernels (pallas_kernels/skinny_linear.py) and the model's fast path
(specjax/fused.py): Pallas interpreter, CUDA lowering and routing on CPU; real runs under @pytest.mark.gpu."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import mesh as mesh_lib

from pallas_kernels import skinny_linear as sl
from specjax import cache as kv
from specjax import config, fused, model

pytestmark = pytest.mark.filterwarnings("ignore:.*Pallas Triton backend is deprecated")
SMALL = sl.TuningConfig(block_n=8, block_k=32)   # several chunks and a masked tail at I = 72


def _inputs(M, I=72, N=48, F=32, H=4, G=2, d=32, B=1, S=20, dtype=jnp.bfloat16, seed=0):
    ks = iter(jax.random.split(jax.random.key(seed), 12))
    w = lambda *s: (0.1 * jax.random.normal(next(ks), s, jnp.float32)).astype(dtype)
    ang = jax.random.uniform(next(ks), (M, d // 2), jnp.float32, 0, 6.0)
    ang = jnp.concatenate([ang, ang], -1)
    T = M // B
    pos = (jnp.arange(B)[:, None] * 3 + 2 + jnp.arange(T)[None]).reshape(M).astype(jnp.int32)
    return dict(x=jax.random.normal(next(ks), (M, I)), g=1 + w(I), w=w(N, I), wgu=w(2 * F, I), r=jax.random.normal(next(ks), (M, N)),
                wqkv=w((H + 2 * G) * d, I), b=w((H + 2 * G) * d), cos=jnp.cos(ang), sin=jnp.sin(ang), pos=pos,
                k=jax.random.normal(next(ks), (B, S, G, d)).astype(dtype), v=jax.random.normal(next(ks), (B, S, G, d)).astype(dtype))


def _run_all(a, interpret, config=SMALL, H=4, bias=True):
    """Every kernel on the inputs ``a`` (interpret=None: the references)."""
    kw = {} if interpret is None else dict(config=config, interpret=interpret)
    f = (lambda n: getattr(sl, n + "_reference")) if interpret is None else (lambda n: getattr(sl, n))
    qkv = f("norm_qkv_rope")(a["x"], a["g"], a["wqkv"], a["b"] if bias else None, a["cos"], a["sin"], a["pos"],
                             a["k"], a["v"], n_heads=H, eps=1e-5, **kw)
    return {"norm_linear": f("norm_linear")(a["x"], a["g"], a["w"], eps=1e-5, **kw),
            "linear_residual": f("linear_residual")(a["x"], a["w"], a["r"], **kw),
            "norm_swiglu": f("norm_swiglu")(a["x"], a["g"], a["wgu"], eps=1e-5, **kw),
            "q": qkv[0], "k_cache": qkv[1], "v_cache": qkv[2]}


# ---------------------------------------------------------------- CPU: Pallas interpreter
@pytest.mark.parametrize("M,B,dtype,bias", [(1, 1, jnp.bfloat16, False), (6, 2, jnp.bfloat16, True),
                                            (5, 1, jnp.float32, True)])
def test_interpreter_matches_reference(M, B, dtype, bias):
    a = _inputs(M, B=B, dtype=dtype, seed=M)
    out, ref = _run_all(a, True, bias=bias), _run_all(a, None, bias=bias)
    for name in out:
        o, r = np.asarray(out[name], np.float32), np.asarray(ref[name], np.float32)
        assert o.shape == r.shape and np.isfinite(o).all(), name
        tol = 1e-5 * (1 + np.abs(r).max())        # the same arithmetic, summed in another order
        if name.endswith("cache") and dtype == jnp.bfloat16:   # float32 k/v rounded to bf16: one ulp at most
            tol = float(np.abs(r).max()) * 2 ** -7
        np.testing.assert_allclose(o, r, rtol=0, atol=tol, err_msg=name)


def test_interpreter_cache_write_touches_only_the_rows_slots():
    a = _inputs(6, B=2)
    out = _run_all(a, True)
    written = np.zeros(a["k"].shape[:2], bool)
    written[np.arange(6) // 3, np.asarray(a["pos"])] = True
    for name, old in (("k_cache", a["k"]), ("v_cache", a["v"])):
        np.testing.assert_array_equal(np.asarray(out[name])[~written], np.asarray(old)[~written], err_msg=name)
    a["pos"] = a["pos"].at[0].set(a["k"].shape[1])   # past the cache's end: dropped, nothing else changes
    out2 = _run_all(a, True)
    np.testing.assert_array_equal(np.asarray(out2["k_cache"])[0, :2], np.asarray(a["k"])[0, :2])


def _assert_rows_independent(interpret):
    """Row m of an M-row call is bitwise the output of a 1-row call on row m (decode == verify)."""
    a = _inputs(5, seed=3)
    full = _run_all(a, interpret, config=None if not interpret else SMALL)
    for m in (0, 2, 4):
        one = dict(a, x=a["x"][m:m + 1], r=a["r"][m:m + 1], cos=a["cos"][m:m + 1], sin=a["sin"][m:m + 1],
                   pos=a["pos"][m:m + 1])
        alone = _run_all(one, interpret, config=None if not interpret else SMALL)
        for name in ("norm_linear", "linear_residual", "norm_swiglu", "q"):
            np.testing.assert_array_equal(np.asarray(alone[name])[0], np.asarray(full[name])[m], err_msg=name)
        p = int(a["pos"][m])
        np.testing.assert_array_equal(np.asarray(alone["k_cache"])[0, p], np.asarray(full["k_cache"])[0, p])


def test_interpreter_rows_are_independent_bitwise():
    _assert_rows_independent(True)


@pytest.mark.parametrize("kw,msg", [(dict(block_n=12), "block_n"), (dict(block_k=8), "block_k"),
                                    (dict(num_warps=3), "num_warps"), (dict(num_stages=0), "num_stages")])
def test_tuning_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        sl.TuningConfig(**kw)


def test_entries_reject_bad_inputs():
    a = _inputs(3)
    with pytest.raises(ValueError, match="1..16 rows"):
        sl.norm_linear(jnp.zeros((17, 72)), a["g"], a["w"], eps=1e-5)
    with pytest.raises(ValueError, match="disagree on I"):
        sl.linear_residual(a["x"], a["w"][:, :70], a["r"])
    with pytest.raises(ValueError, match="multiple of block_n"):
        sl.norm_linear(a["x"], a["g"], a["w"][:42], eps=1e-5)
    with pytest.raises(ValueError, match="H=3"):
        sl.norm_qkv_rope(a["x"], a["g"], a["wqkv"], None, a["cos"], a["sin"], a["pos"], a["k"], a["v"],
                         n_heads=3, eps=1e-5)


# ---------------------------------------------------------------- CPU: the model's fast path
def _forward_pair(monkeypatch, cfg, dtype, on="interpret"):
    """(XLA path, fused path: ``on`` = "interpret" or "1" on a GPU): logits of a 5-token verify and of
    5 decode steps, and the caches after each."""
    p = model.init_params(cfg, jax.random.key(1), dtype=dtype, scale=0.1)
    toks = jax.random.randint(jax.random.key(2), (2, 11), 3, cfg.vocab_size - 3)
    _, _, c = model.forward(p, cfg, toks[:, :6], kv.init_cache(cfg, 2, 32, dtype))
    res = {}
    for env in ("0", on):
        monkeypatch.setenv("SPECJAX_FUSED", env)
        assert fused.mode(cfg, 10, dtype) == (None if env == "0" else "interpret" if env == on == "interpret"
                                              else "kernel")
        f = jax.jit(lambda t, c: model.forward(p, cfg, t, c))
        verify, _, cv = f(toks[:, 6:], c)
        steps, cc = [], c
        for t in range(5):
            lg, _, cc = f(toks[:, 6 + t:7 + t], cc)
            steps.append(lg)
        res[env] = (np.asarray(verify), np.asarray(jnp.concatenate(steps, 1)), cv, cc)
    return res["0"], res[on]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_forward_matches_xla_path(monkeypatch, arch):
    cfg = config.tiny(arch, head_dim=32)
    assert fused.mode(cfg, 5, jnp.bfloat16) is None and fused.mode(cfg, 1, jnp.bfloat16) is None  # CPU
    xla, fz = _forward_pair(monkeypatch, cfg, jnp.bfloat16)
    for i in range(2):
        np.testing.assert_allclose(fz[i], xla[i], rtol=0, atol=1e-5)
    for c_x, c_f in zip(jax.tree.leaves(xla[2]), jax.tree.leaves(fz[2])):
        np.testing.assert_array_equal(np.asarray(c_f, np.float32), np.asarray(c_x, np.float32))


def test_mode_routing(monkeypatch):
    cfg = config.tiny(head_dim=32)
    monkeypatch.setenv("SPECJAX_FUSED", "1")
    assert fused.mode(cfg, 1, jnp.bfloat16) is None                      # this CPU host
    monkeypatch.setattr(fused, "_gpu_backend", lambda: True)
    assert fused.mode(cfg, 1, jnp.bfloat16) == "kernel"
    assert fused.mode(cfg, 16, jnp.bfloat16) == "kernel"
    assert fused.mode(cfg, 17, jnp.bfloat16) is None                     # prefill / wide verify: XLA
    assert fused.mode(cfg.replace(compute_dtype="float32"), 1, jnp.bfloat16) is None
    assert fused.mode(cfg.replace(ffn_dim=102), 1, jnp.bfloat16) is None  # not a multiple of block_n
    for off in ("0", None):                                              # off by default
        monkeypatch.setenv("SPECJAX_FUSED", off) if off else monkeypatch.delenv("SPECJAX_FUSED")
        assert fused.mode(cfg, 1, jnp.bfloat16) is None
    monkeypatch.setenv("SPECJAX_FUSED", "interpret")
    assert fused.mode(cfg, 1, jnp.bfloat16) == "interpret"
    monkeypatch.setenv("SPECJAX_FUSED", "yes")
    with pytest.raises(ValueError, match="expected 0 .off, default., 1 .on, GPU. or interpret"):
        fused.mode(cfg, 1, jnp.bfloat16)


# ---------------------------------------------------------------- CPU: lowering for CUDA
SMOLLM2 = config.ModelConfig(vocab_size=49152, d_model=576, n_layers=2, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                             tie_embeddings=True)


def test_model_decode_step_lowers_for_cuda(monkeypatch):
    """A SmolLM2-shaped (2 layers) decode step and an 8-token verify lower to Triton for an H200: the
    four fused kernels, the LM head kernel and the decode attention kernel, and no XLA cache write."""
    monkeypatch.setenv("SPECJAX_FUSED", "1")
    monkeypatch.setattr(fused, "_gpu_backend", lambda: True)
    from pallas_kernels import dispatch
    monkeypatch.setattr(dispatch, "_gpu_backend", lambda: True)
    monkeypatch.setattr("specjax.attention._use_kernels", lambda: True)
    p = jax.eval_shape(lambda: model.init_params(SMOLLM2, jax.random.key(0), dtype=jnp.bfloat16))
    c = jax.eval_shape(lambda: kv.init_cache(SMOLLM2, 1, 512, jnp.bfloat16))
    h200 = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    for T in (1, 8):
        f = lambda p, t, c: model.forward(p, SMOLLM2, t, c)
        with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(
                mesh_lib.AbstractMesh((1,), ("x",), abstract_device=h200)):
            warnings.simplefilter("ignore", DeprecationWarning)
            text = jax.jit(f).trace(p, jax.ShapeDtypeStruct((1, T), jnp.int32), c).lower(
                lowering_platforms=("cuda",)).as_text()
        for name in ("norm_qkv_rope", "linear_residual", "norm_swiglu", "norm_linear", "decode_attention"):
            assert name in text, (T, name)
        assert "dynamic_update_slice" not in text, T   # the K/V writes happen inside norm_qkv_rope


# ---------------------------------------------------------------- GPU
GPU_SHAPES = {"smollm2": (576, 1536, 49152, 9, 3, 64), "llama3-8b": (4096, 14336, 128256, 32, 8, 128)}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
@pytest.mark.parametrize("M", [1, 8, 16])
def test_gpu_kernels_match_reference(shape, M):
    D, F, V, H, G, d = GPU_SHAPES[shape]
    a = sl._layer_inputs(M, D, F, V, H, G, d)
    for kname, (kern, ref) in sl._calls(H).items():
        for o, r in zip(jax.tree.leaves(kern(None)(a)), jax.tree.leaves(ref(a))):
            o, r = np.asarray(o, np.float32), np.asarray(r, np.float32)
            assert np.isfinite(o).all(), kname
            scale = 1 + np.abs(r).max()
            tol = scale * (2 ** -7 if o.size == a["k"].size else 2e-5)
            np.testing.assert_allclose(o, r, rtol=0, atol=tol, err_msg=kname)


@pytest.mark.gpu
def test_gpu_rows_are_independent_bitwise():
    _assert_rows_independent(False)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gpu_verify_equals_decode_steps_bitwise(monkeypatch, arch):
    """bf16 SmolLM2-shaped model: a 5-token verify forward gives the logits of 5 decode steps bit for bit
    (fused path); and both are close to the XLA path."""
    cfg = SMOLLM2.replace(arch=arch, qkv_bias=arch == "qwen2", n_layers=4)
    xla, fz = _forward_pair(monkeypatch, cfg, jnp.bfloat16, on="1")
    np.testing.assert_array_equal(fz[0], fz[1])
    np.testing.assert_allclose(fz[0], xla[0], rtol=0, atol=2e-2 * (1 + np.abs(xla[0]).max()))


@pytest.mark.gpu
def test_gpu_greedy_speculative_equals_ar_token_for_token(monkeypatch):
    """bf16, fused path on: greedy speculation emits exactly greedy AR decoding's tokens, for a batch of
    two prompts of different lengths. The drafter is the target itself (a draft model with the same
    weights), so nearly every draft is accepted and every verify row (2 x 8 = 16) decides a token."""
    from specjax.generate import generate
    from specjax.speculative import DraftModel, speculative_generate
    monkeypatch.setenv("SPECJAX_FUSED", "1")
    cfg = SMOLLM2.replace(n_layers=4)
    p = model.init_params(cfg, jax.random.key(5), dtype=jnp.bfloat16, scale=0.05)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 4000, 40).tolist(), rng.integers(10, 4000, 29).tolist()]
    ar = generate(p, cfg, prompts, max_new_tokens=64, eos_token_ids=())
    sp = speculative_generate(p, cfg, prompts, DraftModel(cfg), p, num_draft=7, max_new_tokens=64,
                              eos_token_ids=())
    assert sp.output_ids == ar.output_ids
    assert sp.metrics()["mean_accepted"] > 4.0, sp.metrics()["mean_accepted"]
