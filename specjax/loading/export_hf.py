"""Our ``(ModelConfig, params)`` -> an HF folder (``config.json`` + ``model.safetensors``).

The inverse of ``hf.load_hf`` through the same name map, so ``load_hf(export_hf(...))`` gives the
params back bit for bit. The config uses the transformers-4 keys (``rope_theta``, ``rope_scaling``),
which transformers 5 also reads. Files are written to temp files in the folder, then renamed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from specjax.config import ModelConfig
from specjax.files import atomic_write, atomic_write_text
from specjax.loading import namemap
from specjax.loading.build import split_params
from specjax.loading.hf import INDEX, SINGLE

_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_config(cfg: ModelConfig, dtype_name: str = "float32") -> dict:
    """The transformers ``config.json`` dict describing ``cfg``."""
    rs = cfg.rope_scaling
    eos = list(cfg.eos_token_ids)
    out = {
        "architectures": [_CLASSES[cfg.arch]], "model_type": cfg.arch, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.ffn_dim, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": None if rs is None else {
            "rope_type": "llama3", "factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
            "high_freq_factor": rs.high_freq_factor,
            "original_max_position_embeddings": rs.original_max_position_embeddings},
        "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.max_seq_len,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "torch_dtype": dtype_name,
    }
    if cfg.arch == "llama":
        out.update(attention_bias=False, mlp_bias=False)
    return out


def export_hf(params: dict, cfg: ModelConfig, folder: str | os.PathLike) -> Path:
    """Write ``params`` as an HF checkpoint folder that ``load_hf`` and transformers can read."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = split_params(namemap.plan("hf", cfg), params, cfg)
    tensors = {name: np.ascontiguousarray(w) for name, w in tensors.items()}
    dtype_name = str(np.asarray(params["embed"]).dtype)
    atomic_write(folder / SINGLE, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    text = json.dumps(hf_config(cfg, dtype_name), indent=2) + "\n"
    atomic_write_text(folder / "config.json", text)
    (folder / INDEX).unlink(missing_ok=True)  # a stale shard index would shadow the new file
    return folder
