"""Parity with transformers: golden logits/tokens from tests/fixtures/make_parity_fixtures.py.

Tiny random Llama/Qwen2 HF folders (always run) and the real SmolLM2-135M GGUF (skips unless
`specjax fetch` has put it in the cache). Relative error is ||ours - ref|| / ||ref|| in float32.
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import assets, model
from specjax import cache as kv
from specjax.errors import AssetsMissing
from specjax.generate import generate
from specjax.loading import export_hf, load_model

FIX = Path(__file__).parent / "fixtures"
TINY = {"tiny_llama": "tiny_llama_logits.npy", "tiny_llama_sharded": "tiny_llama_logits.npy",
        "tiny_llama3_rope": "tiny_llama3_rope_logits.npy", "tiny_llama_tied": "tiny_llama_tied_logits.npy",
        "tiny_qwen2": "tiny_qwen2_logits.npy"}
PREFILL = 10


def rel(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def tokens():
    return jnp.asarray(np.load(FIX / "tiny_tokens.npy"))


@pytest.mark.parametrize("name", TINY)
def test_tiny_full_forward_matches_transformers(name, tokens):
    cfg, params = load_model(FIX / name, jnp.float32)
    logits, _, _ = model.forward(params, cfg, tokens)
    assert rel(logits, np.load(FIX / TINY[name])) < 1e-5


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_llama3_rope", "tiny_llama_tied", "tiny_qwen2"])
def test_tiny_incremental_decoding_matches_transformers(name, tokens):
    """Prefill, then one token at a time through the KV cache; every position matches the reference."""
    cfg, params = load_model(FIX / name, jnp.float32)
    B, T = tokens.shape
    step = jax.jit(lambda p, t, c: model.forward(p, cfg, t, c))
    logits, _, cache = step(params, tokens[:, :PREFILL], kv.init_cache(cfg, B, 32))
    pieces = [logits]
    for t in range(PREFILL, T):
        logits, _, cache = step(params, tokens[:, t:t + 1], cache)
        pieces.append(logits)
    assert int(cache.lengths_B[0]) == T
    assert rel(jnp.concatenate(pieces, axis=1), np.load(FIX / TINY[name])) < 1e-5


def test_sharded_folder_equals_single_file():
    cfg_a, a = load_model(FIX / "tiny_llama", jnp.float32)
    cfg_b, b = load_model(FIX / "tiny_llama_sharded", jnp.float32)
    assert cfg_a == cfg_b
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b))


@pytest.mark.parametrize("name", ["tiny_llama3_rope", "tiny_llama_tied", "tiny_qwen2"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_export_then_load_gives_identical_params(name, dtype, tmp_path):
    cfg, params = load_model(FIX / name, dtype)
    export_hf(params, cfg, tmp_path / "out")
    cfg2, params2 = load_model(tmp_path / "out", dtype)
    assert cfg2 == cfg
    assert jax.tree.structure(params2) == jax.tree.structure(params)
    assert all(x.dtype == dtype for x in jax.tree.leaves(params2))
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), params, params2))


def test_transformers_reproduces_our_exported_models():
    """Recorded by the fixture script: transformers ran folders written by export_hf."""
    check = json.loads((FIX / "tiny_export_check.json").read_text())["relative_error"]
    assert set(check) == {"llama3_rope_untied", "qwen2_tied"}
    assert all(err < 1e-5 for err in check.values()), check


# ---- the real model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = assets.asset_path("smollm2-135m-instruct")
    except AssetsMissing as e:
        pytest.skip(f"SmolLM2 GGUF not fetched ({e})")
    meta = json.loads((FIX / "smollm2_parity.json").read_text())
    if assets.sha256_of(path) != meta["gguf_sha256"]:
        pytest.skip(f"{path} is not the GGUF the golden fixtures were made from")
    cfg, params = load_model(path, jnp.float32)
    return cfg, params, meta


@pytest.mark.assets
def test_smollm2_prompt_logits_match_transformers(smollm2):
    cfg, params, meta = smollm2
    ref = np.concatenate([np.load(FIX / f) for f in meta["logit_files"]])
    positions = jnp.asarray([meta["positions"]], jnp.int32)
    logits, _, _ = model.forward(params, cfg, jnp.asarray([meta["prompt_ids"]]), logits_index_BN=positions)
    errs = [rel(logits[0, i], ref[i]) for i in range(len(ref))]
    assert max(errs) < 1e-4, dict(zip(meta["positions"], errs))


@pytest.mark.assets
def test_smollm2_mtbench_last_prompt_logits_match_transformers(smollm2):
    cfg, params, meta = smollm2
    prompts = [q["prompt_ids"] for q in meta["mtbench"]]
    toks = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
    for i, p in enumerate(prompts):
        toks[i, :len(p)] = p
    last = jnp.asarray([[len(p) - 1] for p in prompts], jnp.int32)
    logits, _, _ = model.forward(params, cfg, jnp.asarray(toks), logits_index_BN=last)
    ref = np.load(FIX / "smollm2_mtbench_last_logits.npy")
    errs = [rel(logits[i, 0], ref[i]) for i in range(len(prompts))]
    assert max(errs) < 1e-4, errs


@pytest.mark.assets
def test_smollm2_greedy_tokens_match_transformers(smollm2):
    """64 greedy tokens per MT-bench prompt (EOS not special, as in the fixture), batched and ragged."""
    cfg, params, meta = smollm2
    prompts = [q["prompt_ids"] for q in meta["mtbench"]]
    want = [q["output_ids"] for q in meta["mtbench"]]
    got = generate(params, cfg, prompts, max_new_tokens=len(want[0]), eos_token_ids=()).output_ids
    for q, g, w in zip(meta["mtbench"], got, want):
        first_diff = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        assert g == w, f"question {q['question_id']}: tokens differ from index {first_diff} ({g} vs {w})"
