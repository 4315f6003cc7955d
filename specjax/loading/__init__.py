"""Checkpoint loading: GGUF files and HF folders -> ``(ModelConfig, params)``.

    cfg, params = load_model("~/.cache/specjax/models/smollm2-135m-instruct.gguf", jnp.float32)

Both formats go through one declarative name map (``namemap.py``) whose named transforms
(``transforms.py``) fuse q|k|v and gate|up (weights stay ``[out, in]`` as in HF) and undo llama.cpp's Q/K
row permutation. Any mismatch (missing/unexpected tensor, wrong shape, corrupt file) raises
``specjax.errors.CheckpointError``. ``export_hf`` writes params back as an HF folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.errors import CheckpointError
from specjax.loading.export_hf import export_hf
from specjax.loading.gguf_file import load_gguf
from specjax.loading.hf import load_hf

__all__ = ["load_model", "load_gguf", "load_hf", "export_hf"]


def load_model(path: str | os.PathLike, dtype=jnp.bfloat16) -> tuple[ModelConfig, dict]:
    """Load a ``.gguf`` file or an HF folder (``config.json`` + safetensors) as ``(cfg, params)``.

    Tensors are cast to ``dtype`` (bfloat16 by default; pass ``jnp.float32`` for exact parity checks).
    """
    path = Path(path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, dtype)
    if path.is_dir() and (path / "config.json").is_file():
        return load_hf(path, dtype)
    raise CheckpointError(f"{path} is neither a .gguf file nor a folder with config.json "
                          f"(exists: {path.exists()}); pass a GGUF file or an HF checkpoint folder")
