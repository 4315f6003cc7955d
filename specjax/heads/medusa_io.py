"""Medusa heads on disk in the Medusa repository's layout (FasterDecoding/Medusa).

``config.json`` carries ``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``,
``hidden_size`` and ``vocab_size``; ``medusa_lm_head.safetensors`` holds the state dict of the
repository's ``medusa_head`` ModuleList: ``{k}.0.linear.weight`` [D, D] (torch ``[out, in]``),
``{k}.0.linear.bias`` [D] and ``{k}.1.weight`` [V, D] (the head's LM head) for head k.
The repository builds its residual blocks as ``[ResBlock(D)] * num_layers`` (one shared module), so
only one block per head is representable: we export ``num_layers == 1``.

Heads that share the target's LM head can be written two ways: ``lm_head="materialize"`` copies the
target's LM head into every ``{k}.1.weight`` (what the Medusa repository loads), ``lm_head="shared"``
omits them and sets ``"specjax_shared_lm_head": true`` (small enough to ship; only specjax reads it).
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
from specjax.heads.medusa import MedusaConfig
from specjax.files import atomic_write, atomic_write_text

WEIGHTS = "medusa_lm_head.safetensors"


def save_medusa(folder: str | os.PathLike, params: dict, cfg: MedusaConfig, *, lm_head: str = "shared",
                target_params: dict | None = None, base_model: str = "", extra: dict | None = None) -> Path:
    """Write heads as a Medusa-repository folder (see module doc for ``lm_head``)."""
    if cfg.num_layers != 1:
        raise ValueError(f"the Medusa repository format shares one ResBlock per head; got num_layers={cfg.num_layers}")
    if lm_head not in ("shared", "materialize"):
        raise ValueError(f"lm_head must be 'shared' or 'materialize', got {lm_head!r}")
    own = "lm_head_KVD" in params
    if lm_head == "materialize" and not own and target_params is None:
        raise ValueError("lm_head='materialize' with shared heads needs target_params (to copy its LM head)")
    w, b = np.asarray(params["w_KNDD"]), np.asarray(params["b_KND"])
    tensors = {}
    for k in range(cfg.num_heads):
        tensors[f"{k}.0.linear.weight"] = w[k, 0]
        tensors[f"{k}.0.linear.bias"] = b[k, 0]
        if own:
            tensors[f"{k}.1.weight"] = np.asarray(params["lm_head_KVD"][k])
        elif lm_head == "materialize":
            head = target_params["embed"] if cfg.target.tie_embeddings else target_params["lm_head"]
            tensors[f"{k}.1.weight"] = np.asarray(head).astype(w.dtype)
    tensors = {n: np.ascontiguousarray(x) for n, x in tensors.items()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    config = {"medusa_num_heads": cfg.num_heads, "medusa_num_layers": cfg.num_layers,
              "base_model_name_or_path": base_model,
              "hidden_size": cfg.target.d_model, "vocab_size": cfg.target.vocab_size,
              "specjax_shared_lm_head": not own and lm_head == "shared", "torch_dtype": str(w.dtype), **(extra or {})}
    text = json.dumps(config, indent=2) + "\n"
    atomic_write_text(folder / "config.json", text)
    return folder


def load_medusa(folder: str | os.PathLike, target: ModelConfig, dtype=None) -> tuple[MedusaConfig, dict]:
    """``(MedusaConfig, params)``. Heads with LM heads stored load as own-LM-head heads (materialized
    copies of the target's head then stay separate copies); ``specjax_shared_lm_head`` folders share."""
    folder = Path(folder)
    try:
        c = json.loads((folder / "config.json").read_text())
        with safe_open(folder / WEIGHTS, framework="numpy") as f:
            w = {name: f.get_tensor(name) for name in f.keys()}
        K, n = int(c["medusa_num_heads"]), int(c["medusa_num_layers"])
    except Exception as e:
        raise CheckpointError(f"cannot read Medusa heads from {folder} (config.json + {WEIGHTS}): {e}") from e
    if n != 1:
        raise CheckpointError(f"{folder}: medusa_num_layers={n}; only 1 (the repository's layout) is supported")
    shared = bool(c.get("specjax_shared_lm_head", False))
    D, V = target.d_model, target.vocab_size
    expected = {f"{k}.0.linear.weight": (D, D) for k in range(K)} | {f"{k}.0.linear.bias": (D,) for k in range(K)}
    if not shared:
        expected |= {f"{k}.1.weight": (V, D) for k in range(K)}
    got = {name: x.shape for name, x in w.items()}
    if got != expected:
        raise CheckpointError(f"{folder}/{WEIGHTS} holds {sorted(got.items())[:6]}...; expected exactly "
                              f"{sorted(expected.items())[:6]}... for {K} heads, width {D}, vocab {V}, shared={shared}")
    cfg = MedusaConfig(target, num_heads=K, num_layers=1, own_lm_head=not shared)
    params = {"w_KNDD": np.stack([w[f"{k}.0.linear.weight"] for k in range(K)])[:, None],
              "b_KND": np.stack([w[f"{k}.0.linear.bias"] for k in range(K)])[:, None]}
    if not shared:
        params["lm_head_KVD"] = np.stack([w[f"{k}.1.weight"] for k in range(K)])
    return cfg, {k: jnp.asarray(v, dtype) for k, v in params.items()}
