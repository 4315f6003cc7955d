"""Export/import of EAGLE-3 heads (vLLM/SGLang layout), Medusa heads (Medusa repository layout) and
distilled draft models (HF folders), bit for bit, in float32 and bfloat16."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open

from specjax.errors import CheckpointError
from specjax.heads import draft_io, eagle3, eagle3_io, medusa, medusa_io
from specjax.loading import load_model
from training import recipes, tiny


@pytest.fixture(scope="module")
def target():
    return tiny.target()


def assert_same(a: dict, b: dict):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_eagle3_roundtrip_is_bit_identical_in_vllm_layout(tmp_path, target, dtype):
    cfg, tp = target
    ecfg = eagle3.Eagle3Config(cfg, draft_vocab_size=40, ffn_dim=96)
    ids = jnp.asarray(np.sort(np.random.default_rng(0).choice(cfg.vocab_size, 40, replace=False)), jnp.int32)
    params = eagle3.init_params(ecfg, jax.random.key(0), dtype=dtype)
    eagle3_io.save_eagle3(tmp_path, params, ecfg, ids)
    cfg2, params2, ids2 = eagle3_io.load_eagle3(tmp_path, target=cfg)
    assert cfg2 == ecfg and np.array_equal(ids2, ids)
    assert_same(params, params2)
    cfg3, params3, _ = eagle3_io.load_eagle3(tmp_path)  # the target's shape comes from config.json alone
    assert (cfg3.taps, cfg3.draft_vocab_size, cfg3.target.n_layers, cfg3.target.d_model) == (
        ecfg.taps, 40, cfg.n_layers, cfg.d_model)

    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"] and conf["num_hidden_layers"] == 1
    assert conf["draft_vocab_size"] == 40 and conf["tie_word_embeddings"] is False
    assert conf["eagle_aux_hidden_state_layer_ids"] == list(ecfg.taps)
    D, Q, KV = cfg.d_model, cfg.q_dim, cfg.kv_dim
    want = {"fc.weight": (D, 3 * D), "midlayer.input_layernorm.weight": (D,), "midlayer.hidden_norm.weight": (D,),
            "midlayer.post_attention_layernorm.weight": (D,), "midlayer.self_attn.q_proj.weight": (Q, 2 * D),
            "midlayer.self_attn.k_proj.weight": (KV, 2 * D), "midlayer.self_attn.v_proj.weight": (KV, 2 * D),
            "midlayer.self_attn.o_proj.weight": (D, Q), "midlayer.mlp.gate_proj.weight": (96, D),
            "midlayer.mlp.up_proj.weight": (96, D), "midlayer.mlp.down_proj.weight": (D, 96),
            "norm.weight": (D,), "lm_head.weight": (40, D), "d2t": (40,), "t2d": (cfg.vocab_size,)}
    with safe_open(tmp_path / "model.safetensors", framework="numpy") as f:
        got = {n: f.get_tensor(n) for n in f.keys()}
    assert {n: x.shape for n, x in got.items()} == want
    assert got["d2t"].dtype == np.int64 and got["t2d"].dtype == np.bool_
    assert np.array_equal(got["d2t"] + np.arange(40), ids) and np.array_equal(np.flatnonzero(got["t2d"]), ids)
    assert got["fc.weight"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got["midlayer.self_attn.q_proj.weight"], np.asarray(params["wqkv"][:Q]))


def test_eagle3_import_rejects_a_mismatched_file(tmp_path, target):
    cfg, _ = target
    ecfg = eagle3.Eagle3Config(cfg, draft_vocab_size=16)
    eagle3_io.save_eagle3(tmp_path, eagle3.init_params(ecfg, jax.random.key(0)), ecfg, jnp.arange(16))
    with pytest.raises(CheckpointError, match="does not match"):
        eagle3_io.load_eagle3(tmp_path, target=cfg.replace(d_model=32, n_heads=2, n_kv_heads=1))


@pytest.mark.parametrize("own", [False, True])
def test_medusa_roundtrip_is_bit_identical(tmp_path, target, own):
    cfg, tp = target
    mcfg = medusa.MedusaConfig(cfg, num_heads=3, own_lm_head=own)
    params = jax.tree.map(lambda x: x + jax.random.normal(jax.random.key(1), x.shape), medusa.init_params(mcfg, tp))
    medusa_io.save_medusa(tmp_path / "a", params, mcfg)
    cfg2, params2 = medusa_io.load_medusa(tmp_path / "a", cfg)
    assert cfg2 == mcfg
    assert_same(params, params2)
    # the Medusa repository's own layout: every head carries an LM head ({k}.1.weight, [V, D])
    medusa_io.save_medusa(tmp_path / "b", params, mcfg, lm_head="materialize", target_params=tp)
    with safe_open(tmp_path / "b" / medusa_io.WEIGHTS, framework="numpy") as f:
        names = set(f.keys())
        assert f.get_tensor("0.0.linear.weight").shape == (cfg.d_model, cfg.d_model)
        assert f.get_tensor("2.1.weight").shape == (cfg.vocab_size, cfg.d_model)
    assert names == {f"{k}.{n}" for k in range(3) for n in ("0.linear.weight", "0.linear.bias", "1.weight")}
    cfg3, params3 = medusa_io.load_medusa(tmp_path / "b", cfg)
    assert cfg3.own_lm_head  # materialized copies load as per-head LM heads, computing the same logits
    x = jax.random.normal(jax.random.key(2), (5, cfg.d_model))
    np.testing.assert_array_equal(medusa.logits(params3, cfg3, x, tp), medusa.logits(params, mcfg, x, tp))


@pytest.mark.parametrize("shared", [False, True])
def test_draft_model_roundtrip(tmp_path, target, shared):
    cfg, tp = target
    dcfg, params = recipes.init_draft(tp, cfg, 2)
    params = {**recipes.shared_of(tp, cfg), **params}
    draft_io.save_draft_model(tmp_path, params, dcfg, shared_embedding=shared)
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["num_hidden_layers"] == 2 and bool(conf.get("specjax_shared_embeddings")) == shared
    dcfg2, params2 = draft_io.load_draft_model(tmp_path, tp if shared else None, jnp.float32)
    assert dcfg2 == dcfg
    assert_same(params, params2)
    if not shared:  # an ordinary checkpoint: the generic loader (and --draft-model PATH) reads it
        assert_same(params, load_model(tmp_path, jnp.float32)[1])
    else:
        with pytest.raises(ValueError, match="target_params"):
            draft_io.load_draft_model(tmp_path)
