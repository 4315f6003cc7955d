"""HF folders (``config.json`` + ``model.safetensors`` or a sharded index) -> ``(ModelConfig, params)``.

Reads both config styles: transformers 4 (``rope_theta`` + ``rope_scaling``) and transformers 5
(``rope_parameters``). Tensors are read with ``safetensors`` (numpy; bf16 arrives as ml_dtypes
bfloat16) one at a time and cast to the requested dtype.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from safetensors import safe_open

from specjax.config import ModelConfig, RopeScaling
from specjax.errors import CheckpointError
from specjax.loading import namemap
from specjax.loading.build import build_params

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e


def _rope(hf: dict) -> tuple[float, RopeScaling | None]:
    rp = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or rp
    theta = float(rp.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise CheckpointError(f"rope scaling type {kind!r} is not supported; expected none or 'llama3'")
    return theta, RopeScaling(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                              float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]))


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def config_from_hf(hf: dict, where: str = "config.json") -> ModelConfig:
    arch = hf.get("model_type")
    if arch not in ("llama", "qwen2"):
        raise CheckpointError(f"{where}: model_type {arch!r} is not supported; expected 'llama' or 'qwen2'")
    unsupported = {"hidden_act": hf.get("hidden_act", "silu") != "silu", "mlp_bias": hf.get("mlp_bias", False),
                   "attention_bias": arch == "llama" and hf.get("attention_bias", False),
                   "use_sliding_window": hf.get("use_sliding_window", False)}
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise CheckpointError(f"{where}: unsupported settings {[(k, hf.get(k)) for k in bad]}; specjax implements "
                              "SwiGLU (silu), no MLP/output biases, full attention")
    theta, scaling = _rope(hf)
    try:
        return ModelConfig(
            vocab_size=int(hf["vocab_size"]), d_model=int(hf["hidden_size"]), n_layers=int(hf["num_hidden_layers"]),
            n_heads=int(hf["num_attention_heads"]),
            n_kv_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
            ffn_dim=int(hf["intermediate_size"]), head_dim=int(hf.get("head_dim") or 0), rope_theta=theta,
            rope_scaling=scaling, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)), qkv_bias=arch == "qwen2",
            max_seq_len=int(hf.get("max_position_embeddings", 2048)),
            bos_token_id=None if hf.get("bos_token_id") is None else int(hf["bos_token_id"]),
            eos_token_ids=_ids(hf.get("eos_token_id")), arch=arch)
    except KeyError as e:
        raise CheckpointError(f"{where} lacks {e.args[0]!r}, which the loader needs") from e
    except ValueError as e:
        raise CheckpointError(f"{where} gives an invalid config: {e}") from e


def _shard_of(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    if (folder / INDEX).is_file():
        weight_map = _read_json(folder / INDEX).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{folder / INDEX} has no 'weight_map' object")
        return {name: folder / file for name, file in weight_map.items()}
    if not (folder / SINGLE).is_file():
        raise CheckpointError(f"{folder} has neither {SINGLE} nor {INDEX}; found {sorted(os.listdir(folder))}")
    return {name: folder / SINGLE for name in _header(folder / SINGLE)}


def _header(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of one safetensors file, without reading the data."""
    try:
        with safe_open(file, framework="numpy") as f:
            return {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    except Exception as e:  # safetensors raises its own SafetensorError on bad headers
        raise CheckpointError(f"cannot read safetensors file {file} (missing, truncated or corrupt?): {e}") from e


def _shapes(shard_of: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for file in sorted(set(shard_of.values())):
        shapes.update({n: s for n, s in _header(file).items() if shard_of.get(n) == file})
    return shapes


def load_hf(folder: str | os.PathLike, dtype) -> tuple[ModelConfig, dict]:
    folder = Path(folder)
    cfg = config_from_hf(_read_json(folder / "config.json"), str(folder / "config.json"))
    shard_of = _shard_of(folder)
    steps = namemap.plan("hf", cfg)
    namemap.check(steps, _shapes(shard_of), namemap.ignored_names("hf", cfg), str(folder))
    with contextlib.ExitStack() as stack:
        handles = {}

        def fetch(name: str):
            file = shard_of[name]
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(file, framework="numpy"))
            return handles[file].get_tensor(name)

        try:
            return cfg, build_params(steps, fetch, cfg, dtype)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"reading tensors from {folder} failed (truncated or corrupt file?): {e}") from e
