"""Loader behaviour: GGUF/HF round trips, the GGUF header cache, Q/K un-permutation, name-map coverage, corrupt
files."""

import json

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specjax import assets, config, layers, model
from specjax.errors import CheckpointError
from specjax.loading import export_hf, gguf_header, load_model, namemap
from specjax.loading.build import split_params
from specjax.loading.hf import config_from_hf
from specjax.loading.transforms import permute_rows, unpermute_rows

EPS = 2.0 ** -16  # exact in GGUF's float32 metadata, so configs compare equal after a round trip


def random_model(arch="llama", seed=0, **kw):
    cfg = config.tiny(arch, norm_eps=EPS, **kw)
    return cfg, model.init_params(cfg, jax.random.key(seed), scale=0.15)


def write_gguf(path, cfg, params, q8_embed=False, extra=None, drop=()):
    """A GGUF as llama.cpp would write it (Llama Q/K rows permuted), through our name map's inverse."""
    tensors = split_params(namemap.plan("gguf", cfg), jax.tree.map(np.asarray, params), cfg)
    tensors.update(extra or {})
    w = gguf.GGUFWriter(str(path), cfg.arch)
    w.add_block_count(cfg.n_layers), w.add_context_length(cfg.max_seq_len), w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.ffn_dim), w.add_head_count(cfg.n_heads), w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta), w.add_layer_norm_rms_eps(cfg.norm_eps), w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(cfg.bos_token_id), w.add_eos_token_id(cfg.eos_token_ids[0])
    for name, t in tensors.items():
        if name in drop:
            continue
        if q8_embed and name == "token_embd.weight":
            q = gguf.quants.quantize(t.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, t.astype(np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def same(a, b) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and jax.tree.all(
        jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b))


# ---- GGUF ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch,kw", [("llama", {}), ("llama", {"tie_embeddings": True, "n_kv_heads": 1}),
                                     ("qwen2", {})])
def test_gguf_round_trip(arch, kw, tmp_path):
    cfg, params = random_model(arch, **kw)
    cfg2, params2 = load_model(write_gguf(tmp_path / "m.gguf", cfg, params), jnp.float32)
    assert cfg2 == cfg
    assert same(params2, params)


def test_gguf_llama_file_holds_permuted_rows(tmp_path):
    """The file really is in llama.cpp order (so the round trip above exercises the un-permutation)."""
    cfg, params = random_model()
    reader = gguf.GGUFReader(write_gguf(tmp_path / "m.gguf", cfg, params))
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}["blk.0.attn_q.weight"]
    q_hf = np.asarray(params["layers"][0]["wqkv"][:cfg.q_dim])  # [out, in] rows, as in HF
    assert not np.array_equal(stored, q_hf)
    np.testing.assert_array_equal(stored, permute_rows(q_hf, cfg.n_heads))


def test_gguf_quantized_tensor_is_dequantized(tmp_path):
    cfg, params = random_model()
    _, params2 = load_model(write_gguf(tmp_path / "m.gguf", cfg, params, q8_embed=True), jnp.float32)
    embed = np.asarray(params["embed"])
    q = gguf.quants.quantize(embed, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(params2["embed"], gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0))
    assert not np.array_equal(params2["embed"], embed)  # Q8_0 is lossy: this did go through dequantize
    assert same(params2["layers"], params["layers"])


def _same_header(a, b) -> None:
    """Two readers (a gguf.GGUFReader, a cached ``gguf_header.Header``) give the loaders the same values."""
    assert {k: f.contents() for k, f in a.fields.items()} == {k: f.contents() for k, f in b.fields.items()}
    assert a.data_offset == b.data_offset and len(a.tensors) == len(b.tensors)
    for x, y in zip(a.tensors, b.tensors):
        assert (x.name, x.tensor_type, x.shape.tolist(), x.n_bytes, x.data_offset) == (
            y.name, y.tensor_type, y.shape.tolist(), y.n_bytes, y.data_offset)
        assert x.data.dtype == y.data.dtype and x.data.shape == y.data.shape
        np.testing.assert_array_equal(np.asarray(x.data), np.asarray(y.data))


def test_gguf_header_cache_loads_what_a_parse_loads(tmp_path, monkeypatch):
    """``gguf_header``: a kept header gives the loaders what a parse of the file gives (config, params bit for
    bit), and the next load takes it without parsing; the tensor data always comes from the file, so new weights
    under the same header bytes load as new; other header bytes or a broken entry are parsed again and the entry
    rewritten; headers under ``MIN_HEADER_BYTES`` are not kept."""
    monkeypatch.setenv("SPECJAX_HOME", str(tmp_path / "home"))
    cfg, params = random_model()
    path = write_gguf(tmp_path / "m.gguf", cfg, params, q8_embed=True)  # Q8_0 and F32 tensors
    entry = gguf_header.entry_path(path)
    _, want = load_model(path, jnp.float32)
    assert not entry.exists()  # a tiny header
    monkeypatch.setattr(gguf_header, "MIN_HEADER_BYTES", 0)
    load_model(path, jnp.float32)
    _same_header(gguf.GGUFReader(path), gguf_header.read(path))
    parse = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a: pytest.fail("parsed although its header was kept"))
    cfg2, got = load_model(path, jnp.float32)
    assert cfg2 == cfg and same(got, want)
    _, params1 = random_model(seed=1)
    write_gguf(path, cfg, params1, q8_embed=True)  # other weights, the same header bytes: the entry holds
    got = load_model(path, jnp.float32)[1]
    monkeypatch.setattr(gguf, "GGUFReader", parse)
    with monkeypatch.context() as m:
        m.setattr(gguf_header, "read", lambda path: None)
        assert same(got, load_model(path, jnp.float32)[1]) and not same(got, want)
    write_gguf(path, cfg, params1)  # an F32 embedding: other header bytes, so the entry is stale
    assert gguf_header.read(path) is None
    assert same(load_model(path, jnp.float32)[1], params1)
    _same_header(gguf.GGUFReader(path), gguf_header.read(path))
    entry.write_text("{not json")
    assert gguf_header.read(path) is None and same(load_model(path, jnp.float32)[1], params1)
    assert gguf_header.read(path) is not None


@pytest.mark.assets
def test_smollm2_cached_header_is_the_parsed_header(tmp_path, monkeypatch):
    """SmolLM2's header (Q4_1, Q8_0, F32 tensors; 49152 tokens, merges, the chat template) through the cache's
    JSON equals gguf's parse of the file: the tokenizer and the weights read the same values either way."""
    path = assets.home() / assets.MODELS["smollm2-135m-instruct"].dest
    if not path.is_file():
        pytest.skip(f"{path} missing: run `specjax fetch` (or `make test`, which fetches)")
    monkeypatch.setenv("SPECJAX_HOME", str(tmp_path))  # a fresh cache, after the model's path was taken
    reader = gguf.GGUFReader(path)
    assert gguf_header.write(path, reader)
    _same_header(reader, gguf_header.read(path))


@pytest.mark.parametrize("n_head", [9, 3])  # SmolLM2: 9 query heads, 3 kv heads, head dim 64
def test_unpermute_turns_pair_rope_into_rotate_half(n_head):
    """llama.cpp rotates adjacent pairs of the permuted rows; un-permuting must give HF rotate-half."""
    d, D, pos = 64, 24, 37
    rng = np.random.default_rng(n_head)
    w_hf = rng.standard_normal((n_head * d, D)).astype(np.float32)
    x = rng.standard_normal(D).astype(np.float32)
    w_cpp = permute_rows(w_hf, n_head)
    np.testing.assert_array_equal(unpermute_rows(w_cpp, n_head), w_hf)
    assert not np.array_equal(w_cpp, w_hf)
    cfg = config.tiny(head_dim=d)
    ang = pos * layers.inv_frequencies(cfg).astype(np.float64)  # [d/2]
    a, b = (w_cpp @ x).reshape(n_head, d // 2, 2).transpose(2, 0, 1)  # adjacent pairs
    pairs = np.stack([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)], -1).reshape(-1, 1)
    cos, sin = layers.rope_tables(cfg, jnp.full((1, 1), pos))
    half = layers.apply_rope(jnp.asarray((w_hf @ x).reshape(1, 1, n_head, d)), cos, sin)
    np.testing.assert_allclose(unpermute_rows(pairs, n_head).reshape(-1), np.asarray(half).reshape(-1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cut", [10, 300, 0.6, -1])
def test_truncated_gguf_raises_checkpoint_error(cut, tmp_path):
    cfg, params = random_model()
    data = write_gguf(tmp_path / "m.gguf", cfg, params).read_bytes()
    n = int(len(data) * cut) if isinstance(cut, float) else cut % len(data)
    (tmp_path / "cut.gguf").write_bytes(data[:n])
    with pytest.raises(CheckpointError, match="cut.gguf"):
        load_model(tmp_path / "cut.gguf", jnp.float32)


def test_corrupt_gguf_raises_checkpoint_error(tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"NOPE" + bytes(range(256)) * 8)
    with pytest.raises(CheckpointError, match="junk.gguf"):
        load_model(tmp_path / "junk.gguf", jnp.float32)


def test_gguf_unexpected_and_missing_tensors(tmp_path):
    cfg, params = random_model()
    extra = {"blk.0.attn_q.bias": np.zeros(cfg.q_dim, np.float32)}
    path = write_gguf(tmp_path / "m.gguf", cfg, params, extra=extra, drop=("blk.1.ffn_up.weight",))
    with pytest.raises(CheckpointError, match=r"1 missing tensor\(s\): blk.1.ffn_up.weight") as e:
        load_model(path, jnp.float32)
    assert "unexpected tensor(s) (not in the name map): blk.0.attn_q.bias" in str(e.value)


def test_gguf_with_llama31_rope_freqs_is_refused(tmp_path):
    cfg, params = random_model()
    path = write_gguf(tmp_path / "m.gguf", cfg, params, extra={"rope_freqs.weight": np.ones(8, np.float32)})
    with pytest.raises(CheckpointError, match="rope_freqs"):
        load_model(path, jnp.float32)


# ---- HF folders ------------------------------------------------------------------------------


@pytest.fixture
def hf_folder(tmp_path):
    cfg, params = random_model("llama")
    return cfg, export_hf(params, cfg, tmp_path / "hf")


def _edit(folder, fn):
    tensors = load_file(folder / "model.safetensors")
    fn(tensors)
    save_file(tensors, folder / "model.safetensors")


def test_hf_unexpected_tensor(hf_folder):
    cfg, folder = hf_folder
    _edit(folder, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": np.zeros(cfg.d_model, np.float32)}))
    with pytest.raises(CheckpointError, match=r"1 unexpected tensor\(s\).*o_proj.bias"):
        load_model(folder, jnp.float32)


def test_hf_missing_tensor(hf_folder):
    _, folder = hf_folder
    _edit(folder, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(CheckpointError, match=r"1 missing tensor\(s\): model.layers.1.mlp.down_proj.weight"):
        load_model(folder, jnp.float32)


def test_hf_wrong_shape(hf_folder):
    cfg, folder = hf_folder
    _edit(folder, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((cfg.q_dim, cfg.d_model),
                                                                                        np.float32)}))
    with pytest.raises(CheckpointError, match=r"k_proj.weight has \(64, 64\), config expects \(32, 64\)"):
        load_model(folder, jnp.float32)


def test_hf_truncated_safetensors(hf_folder):
    _, folder = hf_folder
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(folder, jnp.float32)


def test_hf_config_transformers4_style_and_unsupported():
    base = dict(model_type="llama", vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, rope_theta=500000.0, eos_token_id=[7, 9])
    cfg = config_from_hf({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 8192}})
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == config.RopeScaling(8.0, 1.0, 4.0, 8192)
    assert cfg.n_kv_heads == 4 and cfg.eos_token_ids == (7, 9) and cfg.head_dim == 16
    with pytest.raises(CheckpointError, match="'yarn'"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(CheckpointError, match="mlp_bias"):
        config_from_hf({**base, "mlp_bias": True})
    with pytest.raises(CheckpointError, match="'mistral'"):
        config_from_hf({**base, "model_type": "mistral"})
    with pytest.raises(CheckpointError, match="'intermediate_size'"):
        config_from_hf({k: v for k, v in base.items() if k != "intermediate_size"})


def test_export_refuses_params_that_do_not_match_config(tmp_path):
    cfg, params = random_model("llama")
    with pytest.raises(CheckpointError, match="lm_head"):
        export_hf(params, cfg.replace(tie_embeddings=True), tmp_path / "x")
    bad = {**params, "final_norm": jnp.ones((cfg.d_model + 1,))}
    with pytest.raises(CheckpointError, match=r"final_norm has shape \(65,\)"):
        export_hf(bad, cfg, tmp_path / "y")


def test_load_model_rejects_other_paths(tmp_path):
    with pytest.raises(CheckpointError, match="neither a .gguf file nor a folder with config.json"):
        load_model(tmp_path / "nothing-here", jnp.float32)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="lacks 'vocab_size'"):
        load_model(tmp_path, jnp.float32)
