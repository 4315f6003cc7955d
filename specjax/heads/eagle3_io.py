"""EAGLE-3 heads on disk in the layout vLLM and SGLang load (SpecForge's ``LlamaForCausalLMEagle3``).

A folder with ``config.json`` (``architectures: ["LlamaForCausalLMEagle3"]``, ``num_hidden_layers: 1``,
``draft_vocab_size``, ``eagle_aux_hidden_state_layer_ids`` = our taps, ``tie_word_embeddings: false``
so SGLang builds a separate draft LM head) and ``model.safetensors`` holding, in torch's
``[out, in]`` order: ``fc.weight`` [D, 3D]; ``midlayer.{input_layernorm, hidden_norm,
post_attention_layernorm}.weight`` [D]; ``midlayer.self_attn.{q,k,v,o}_proj.weight``;
``midlayer.mlp.{gate,up,down}_proj.weight``; ``norm.weight`` [D]; ``lm_head.weight`` [N, D];
``d2t`` int64 [N] (target id - draft id) and ``t2d`` bool [V]. No ``embed_tokens``: vLLM and SGLang
then use the target's embedding, as we do. ``load_eagle3(save_eagle3(...))`` is bit-identical.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from specjax.config import ModelConfig
from specjax.errors import CheckpointError
from specjax.heads.eagle3 import Eagle3Config
from specjax.files import atomic_write, atomic_write_text
from specjax.loading.export_hf import hf_config
from specjax.loading.hf import config_from_hf

WEIGHTS = "model.safetensors"
_NORMS = {"input_norm": "midlayer.input_layernorm.weight", "hidden_norm": "midlayer.hidden_norm.weight",
          "mlp_norm": "midlayer.post_attention_layernorm.weight", "final_norm": "norm.weight"}


def tensors_of(params: dict, cfg: Eagle3Config, draft_ids_N) -> dict[str, np.ndarray]:
    """Our params -> the checkpoint's named tensors (both ``[out, in]``: a split, no transposes)."""
    t, F = cfg.target, cfg.ffn_dim
    p = {k: np.asarray(v) for k, v in params.items()}
    q, k, v = np.split(p["wqkv"], [t.q_dim, t.q_dim + t.kv_dim], axis=0)
    gate, up = np.split(p["w_gate_up"], [F], axis=0)
    ids = np.asarray(draft_ids_N, np.int64)
    t2d = np.zeros(t.vocab_size, bool)
    t2d[ids] = True
    out = {"fc.weight": p["fc"], "midlayer.self_attn.q_proj.weight": q, "midlayer.self_attn.k_proj.weight": k,
           "midlayer.self_attn.v_proj.weight": v, "midlayer.self_attn.o_proj.weight": p["wo"],
           "midlayer.mlp.gate_proj.weight": gate, "midlayer.mlp.up_proj.weight": up,
           "midlayer.mlp.down_proj.weight": p["w_down"], "lm_head.weight": p["lm_head"],
           "d2t": ids - np.arange(len(ids), dtype=np.int64), "t2d": t2d}
    out.update({name: p[key] for key, name in _NORMS.items()})
    return {name: np.ascontiguousarray(x) for name, x in out.items()}


def config_of(cfg: Eagle3Config, dtype_name: str) -> dict:
    c = hf_config(cfg.layer, dtype_name)
    c.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=cfg.draft_vocab_size,
             target_hidden_size=cfg.target.d_model, tie_word_embeddings=False,
             eagle_aux_hidden_state_layer_ids=list(cfg.taps),
             eagle_config={"eagle_aux_hidden_state_layer_ids": list(cfg.taps), "use_aux_hidden_state": True},
             specjax={"target_num_hidden_layers": cfg.target.n_layers})
    return c


def save_eagle3(folder: str | os.PathLike, params: dict, cfg: Eagle3Config, draft_ids_N,
                extra: dict | None = None) -> Path:
    """Write the head as a vLLM/SGLang-loadable folder; ``extra`` keys are merged into config.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = tensors_of(params, cfg, draft_ids_N)
    atomic_write(folder / WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    text = json.dumps({**config_of(cfg, str(tensors["fc.weight"].dtype)), **(extra or {})}, indent=2) + "\n"
    atomic_write_text(folder / "config.json", text)
    return folder


def _target_of(hf: dict, where: str) -> tuple[ModelConfig, tuple[int, ...]]:
    key = "eagle_aux_hidden_state_layer_ids"
    taps = hf.get(key) or (hf.get("eagle_config") or {}).get(key)
    n_layers = (hf.get("specjax") or {}).get("target_num_hidden_layers")
    if not taps or not n_layers:
        raise CheckpointError(f"{where} lacks eagle_aux_hidden_state_layer_ids or specjax.target_num_hidden_layers; "
                              "pass the target config to load_eagle3(..., target=cfg)")
    return config_from_hf({**hf, "num_hidden_layers": n_layers, "tie_word_embeddings": False}, where), tuple(taps)


def load_eagle3(folder: str | os.PathLike, target: ModelConfig | None = None, dtype=None):
    """``(Eagle3Config, params, draft_ids_N)`` from a folder written by ``save_eagle3`` (or SpecForge,
    given ``target``). Tensors keep their stored dtype unless ``dtype`` is given."""
    folder = Path(folder)
    try:
        hf = json.loads((folder / "config.json").read_text())
        with safe_open(folder / WEIGHTS, framework="numpy") as f:
            w = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:
        raise CheckpointError(f"cannot read an EAGLE-3 head from {folder} (config.json + {WEIGHTS}): {e}") from e
    if hf.get("architectures") != ["LlamaForCausalLMEagle3"] or hf.get("num_hidden_layers") != 1:
        raise CheckpointError(f"{folder}/config.json describes {hf.get('architectures')} with "
                              f"{hf.get('num_hidden_layers')} layers; expected LlamaForCausalLMEagle3 with 1 layer")
    tcfg, taps = _target_of(hf, str(folder / "config.json")) if target is None else (target, tuple(
        hf.get("eagle_aux_hidden_state_layer_ids") or ()))
    cfg = Eagle3Config(tcfg, int(hf["draft_vocab_size"]), taps, int(hf["intermediate_size"]))
    ids = np.asarray(w.get("d2t", np.zeros(0)), np.int64) + np.arange(len(w.get("d2t", ())))
    expected = tensors_of(_shapes_only(cfg), cfg, np.arange(cfg.draft_vocab_size))
    problems = [f"{n}: {w[n].shape} != {x.shape}" for n, x in expected.items() if n in w and w[n].shape != x.shape]
    missing, unexpected = expected.keys() - w.keys(), w.keys() - expected.keys() - {"embed_tokens.weight"}
    if problems or missing or unexpected:
        raise CheckpointError(f"{folder}/{WEIGHTS} does not match its config: missing {sorted(missing)}, "
                              f"unexpected {sorted(unexpected)}, wrong shapes {problems}")
    if not np.array_equal(np.flatnonzero(w["t2d"]), np.sort(ids)):
        raise CheckpointError(f"{folder}: t2d does not mark exactly the target ids that d2t maps to")
    params = {"fc": w["fc.weight"], "wo": w["midlayer.self_attn.o_proj.weight"],
              "w_down": w["midlayer.mlp.down_proj.weight"],
              "wqkv": np.concatenate([w[f"midlayer.self_attn.{x}_proj.weight"] for x in "qkv"], axis=0),
              "w_gate_up": np.concatenate([w[f"midlayer.mlp.{x}_proj.weight"] for x in ("gate", "up")], axis=0),
              "lm_head": w["lm_head.weight"], **{key: w[name] for key, name in _NORMS.items()}}
    params = {k: jnp.asarray(v, dtype) for k, v in params.items()}
    return cfg, params, jnp.asarray(ids, jnp.int32)


def _shapes_only(cfg: Eagle3Config) -> dict:
    t, D, F = cfg.target, cfg.target.d_model, cfg.ffn_dim
    shapes = {"fc": (D, 3 * D), "wqkv": (t.q_dim + 2 * t.kv_dim, 2 * D), "wo": (D, t.q_dim), "w_gate_up": (2 * F, D),
              "w_down": (D, F), "lm_head": (cfg.draft_vocab_size, D), **{k: (D,) for k in _NORMS}}
    return {k: np.empty(s, np.int8) for k, s in shapes.items()}
