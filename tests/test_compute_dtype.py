"""``ModelConfig.compute_dtype``: "param" (matmul operands in the weight dtype) vs "float32" (float32
operands, bf16 weights upcast inside each product).

1. float32 weights: "float32" equals "param" (nothing to round).
2. bf16 weights: a one-token-at-a-time forward and a K+1-token forward over the same tokens agree
   10-100x more closely with "float32" than with "param" (the rest: K/V rounded into the bf16 cache).
3. Real SmolLM2 in bf16 with "float32": ngram speculative greedy equals AR greedy on MT-bench.
4. Bad values are clear errors (config, pipeline, layers, CLI).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import cache as kv
from specjax import config, model
from specjax.attention import attention_reference
from specjax.cli import build_parser, main
from specjax.generate import generate
from specjax.layers import linear

K, PROMPT = 4, 12


@functools.partial(jax.jit, static_argnums=1)  # one compilation per (config, shapes), not one per call
def _fw(params, cfg, tokens, cache):
    return model.forward(params, cfg, tokens, cache)[::2]


# --- 1. float32 weights: the two modes agree -------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_float32_weights_same_as_param(arch):
    cfg = config.tiny(arch)
    params = model.init_params(cfg, jax.random.key(0), scale=0.1)
    toks = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
    out = {}
    for cd in config.COMPUTE_DTYPES:
        c = cfg.replace(compute_dtype=cd)
        full, _, _ = model.forward(params, c, toks)
        cache = kv.init_cache(c, 2, 32)
        pre, _, cache = model.forward(params, c, toks[:, :5], cache)
        step, _, _ = model.forward(params, c, toks[:, 5:], cache)
        out[cd] = np.concatenate([full, pre, step], axis=1)
    scale = np.abs(out["param"]).max()
    assert np.abs(out["float32"] - out["param"]).max() <= 1e-6 * max(1.0, scale)
    prompts = [[5, 6, 7, 5, 6, 7], [3, 4, 9]]
    ar = {cd: generate(params, cfg.replace(compute_dtype=cd), prompts, max_new_tokens=8, eos_token_ids=()).output_ids
          for cd in config.COMPUTE_DTYPES}
    assert ar["float32"] == ar["param"]


# --- 2. bf16 weights: verify (K+1 tokens) vs decode (1 token) --------------------------------------

MID = config.ModelConfig(vocab_size=2048, d_model=576, n_layers=4, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                         max_seq_len=256)  # SmolLM2's width and heads, 4 layers, small vocab


def _last_bit_noise(params, eps, seed=0):
    """The params with the (bf16) norm weights as float32 times (1 +- eps): a forward whose float32
    values differ from the unperturbed one in the last bits, as a GPU's verify and decode kernels do.
    XLA on CPU runs bf16 matmuls of 1 and K+1 rows alike, so without it the CPU shows little."""
    keys = iter(jax.random.split(jax.random.key(seed), 2 * len(params["layers"]) + 1))

    def noisy(w):
        return w.astype(jnp.float32) * (1 + eps * jax.random.rademacher(next(keys), w.shape, jnp.float32))
    layers = [{**lp, "attn_norm": noisy(lp["attn_norm"]), "mlp_norm": noisy(lp["mlp_norm"])} for lp in params["layers"]]
    return {**params, "layers": layers, "final_norm": noisy(params["final_norm"])}


def _verify_vs_decode_gap(cfg, params, verify_params) -> float:
    """|logits(K+1-token forward) - logits(K one-token forwards)| / |logits| (Frobenius norms) after a
    shared prefill (a bf16 cache; kv.init_cache makes it float32 under compute "float32")."""
    toks = jax.random.randint(jax.random.key(3), (2, PROMPT + K), 3, cfg.vocab_size)
    _, cache = _fw(params, cfg, toks[:, :PROMPT], kv.init_cache(cfg, 2, 64, jnp.bfloat16))
    verify, _ = _fw(verify_params, cfg, toks[:, PROMPT:], cache)
    steps = []
    for i in range(K):
        logits, cache = _fw(params, cfg, toks[:, PROMPT + i:PROMPT + i + 1], cache)
        steps.append(np.asarray(logits))
    decode = np.concatenate(steps, axis=1)
    return float(np.linalg.norm(np.asarray(verify) - decode) / np.linalg.norm(decode))


def test_bf16_verify_and_decode_agree_with_float32_compute():
    params = model.init_params(MID, jax.random.key(1), dtype=jnp.bfloat16, scale=0.05)
    noisy = _last_bit_noise(params, 2.0 ** -20)  # ~8 float32 ulps, about a reduction-order difference
    gap = {(cd, n): _verify_vs_decode_gap(MID.replace(compute_dtype=cd), params, p)
           for cd in config.COMPUTE_DTYPES for n, p in (("plain", params), ("noisy", noisy))}
    # float32 compute also keeps the KV cache in float32 (kv.init_cache), so verify and decode differ by
    # float32 rounding alone. Measured (CPU, jax 0.11.2): float32 ~4e-6 (noisy); param 2e-3..6e-3 (noisy);
    # param "plain" is 0 on CPU (XLA's CPU bf16 matmuls round 1 and K+1 rows alike), so it is not asserted.
    # (Before the float32 cache, float32 compute with a bf16 cache measured 2e-5..2e-4.)
    bound = 3e-5
    assert gap["float32", "plain"] < bound and gap["float32", "noisy"] < bound, gap
    assert gap["param", "noisy"] > 20 * bound, gap  # bf16 operands turn last-bit noise into bf16 ulps


def test_float32_attention_keeps_q_and_probabilities_unrounded():
    kq, kk, kv_ = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (1, 3, 4, 64))
    k = jax.random.normal(kk, (1, 8, 2, 64)).astype(jnp.bfloat16)
    v = jax.random.normal(kv_, (1, 8, 2, 64)).astype(jnp.bfloat16)
    pos = jnp.array([[5, 6, 7]])
    exact = attention_reference(q, k.astype(jnp.float32), v.astype(jnp.float32), pos)
    f32 = attention_reference(q, k, v, pos, compute_dtype="float32")
    param = attention_reference(q, k, v, pos)
    assert float(jnp.abs(f32 - exact).max()) < 1e-6 < float(jnp.abs(param - exact).max())


# --- 3. real SmolLM2, bf16: speculative greedy == AR greedy ---------------------------------------

@pytest.mark.assets
def test_smollm2_bf16_float32_compute_ngram_equals_autoregressive():
    """6 MT-bench prompts x 48 tokens, one ragged batch. On CPU "param" passes too (16/16 MT-bench and
    HumanEval prompts x 128 tokens measured: XLA's CPU bf16 matmuls round 1 and K+1 rows alike); on a
    GPU, where verify and decode run different kernels, this is the test that tells the modes apart."""
    import specjax
    from specjax import prompts
    from specjax.errors import AssetsMissing
    from specjax.speculative import NGram, speculative_generate
    try:
        lm = specjax.load("smollm2-135m-instruct", dtype="bfloat16", compute_dtype="float32")
        ids = [lm.encode(q["prompt"], chat=True) for q in prompts.mtbench()[:6]]
    except AssetsMissing as e:
        pytest.skip(f"SmolLM2 GGUF or MT-bench not fetched, run `specjax fetch` ({e})")
    assert lm.cfg.compute_dtype == "float32" and lm.params["embed"].dtype == jnp.bfloat16
    ar = generate(lm.params, lm.cfg, ids, max_new_tokens=48, eos_token_ids=()).output_ids
    spec = speculative_generate(lm.params, lm.cfg, ids, NGram(1, 3), num_draft=K, max_new_tokens=48,
                                eos_token_ids=()).output_ids
    assert [i for i, (a, b) in enumerate(zip(ar, spec)) if a != b] == []


# --- 4. bad values --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["bfloat16", "fp32", "", None, jnp.float32])
def test_bad_compute_dtype_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="compute_dtype .* expected one of 'param', 'float32'"):
        config.tiny(compute_dtype=bad)
    with pytest.raises(ValueError, match="unknown compute_dtype"):
        config.tiny().replace(compute_dtype=bad)
    with pytest.raises(ValueError, match="unknown compute_dtype"):
        linear(jnp.ones((1, 4)), jnp.ones((3, 4)), bad)


def test_pipeline_rejects_bad_compute_dtype_before_loading():
    import specjax
    with pytest.raises(ValueError, match="unknown compute_dtype 'fp32'"):
        specjax.load("no-such-model", compute_dtype="fp32")


def test_cli_compute_flag(capsys):
    p = build_parser()
    assert p.parse_args(["generate", "--prompt", "x"]).compute == "param"
    assert p.parse_args(["generate", "--prompt", "x", "--compute", "float32"]).compute == "float32"
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "x", "--compute", "fp32"])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == "" and "--compute" in out.err and "invalid choice" in out.err
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--compute {param,float32}" in help_text and "slower" in help_text
