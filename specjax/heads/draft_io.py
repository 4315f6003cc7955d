"""Distilled draft models on disk: an ordinary HF folder, or a slim one sharing the target's embedding.

``save_draft_model(..., shared_embedding=False)`` writes an ordinary checkpoint (``config.json`` +
``model.safetensors``, via ``specjax.loading.export_hf``) that ``load_model`` / ``--draft-model``
read. With ``shared_embedding=True`` the embedding (and an untied LM head) — frozen copies of the
target's — are left out and ``config.json`` says ``"specjax_shared_embeddings": true``;
``load_draft_model`` then takes them from the target's params (a 2-layer SmolLM2 draft shrinks from
~70 MB to ~14 MB in bf16, small enough to ship).

A folder may also hold ``draft_vocab.safetensors`` (``vocab_ids``: int32 [N], ``save_draft_model(vocab_ids=...)``):
the tokens the draft model proposes. ``load_draft_model`` then cuts its LM head to those N rows
(``draft_model.restrict_vocab``; lossless, fewer weights read per draft step), unless ``full_vocab=True``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from specjax.config import ModelConfig
from specjax.errors import CheckpointError
from specjax.loading import export_hf, load_model, namemap
from specjax.loading.build import build_params, split_params
from specjax.files import atomic_write, atomic_write_text
from specjax.loading.export_hf import hf_config
from specjax.loading.hf import SINGLE, config_from_hf

SHARED_NAMES = ("model.embed_tokens.weight", "lm_head.weight")
VOCAB_FILE = "draft_vocab.safetensors"


def save_draft_model(folder: str | os.PathLike, params: dict, cfg: ModelConfig, *, shared_embedding: bool,
                     extra: dict | None = None, vocab_ids=None) -> Path:
    """Write a draft model to ``folder`` (module doc); ``vocab_ids``: its draft vocabulary. Without one, a draft
    vocabulary left in ``folder`` by an earlier save is removed (it would cut this model's LM head on loading)."""
    folder = Path(folder)
    if vocab_ids is not None:
        save_draft_vocab(folder, vocab_ids)
    else:
        (folder / VOCAB_FILE).unlink(missing_ok=True)
    if not shared_embedding:
        export_hf(params, cfg, folder)
        if extra:
            conf = json.loads((folder / "config.json").read_text()) | extra
            atomic_write_text(folder / "config.json", json.dumps(conf, indent=2) + "\n")
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tensors = split_params(namemap.plan("hf", cfg), params, cfg)
    tensors = {n: np.ascontiguousarray(w) for n, w in tensors.items() if n not in SHARED_NAMES}
    atomic_write(folder / SINGLE, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    conf = hf_config(cfg, str(np.asarray(params["final_norm"]).dtype))
    conf |= {"specjax_shared_embeddings": True} | (extra or {})
    atomic_write_text(folder / "config.json", json.dumps(conf, indent=2) + "\n")
    return folder


def save_draft_vocab(folder: str | os.PathLike, vocab_ids) -> Path:
    """Write ``draft_vocab.safetensors`` (the tokens a draft model in ``folder`` proposes)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = {"vocab_ids": np.ascontiguousarray(np.asarray(vocab_ids, np.int32))}
    atomic_write(folder / VOCAB_FILE, lambda tmp: save_file(ids, tmp, metadata={"format": "pt"}))
    return folder / VOCAB_FILE


def draft_vocab_of(folder: str | os.PathLike):
    """The token ids of ``folder``'s ``draft_vocab.safetensors`` (int32 [N]), or None when it has none."""
    path = Path(folder) / VOCAB_FILE
    if not path.is_file():
        return None
    try:
        return load_file(path)["vocab_ids"]
    except Exception as e:
        raise CheckpointError(f"reading {path} failed (expected a tensor 'vocab_ids' of token ids): {e}") from e


def load_draft_model(folder: str | os.PathLike, target_params: dict | None = None, dtype=None, *,
                     full_vocab: bool = False) -> tuple[ModelConfig, dict]:
    """``(cfg, params)``; a slim folder takes its embedding (and untied LM head) from ``target_params``. With a
    ``draft_vocab.safetensors`` beside it the LM head is cut to those tokens, unless ``full_vocab``."""
    from specjax.speculative.drafters.draft_model import restrict_vocab
    folder = Path(folder)
    cfg, params = _load(folder, target_params, dtype)
    ids = None if full_vocab else draft_vocab_of(folder)
    if ids is None:
        return cfg, params
    try:
        return restrict_vocab(cfg, params, ids)
    except ValueError as e:
        raise CheckpointError(f"{folder}/{VOCAB_FILE}: {e}") from e


def fine_tune_start(folder: str | os.PathLike, target_params: dict | None = None):
    """What a fine-tune of ``folder``'s draft model starts from: ``((cfg, params) with the full LM head, the
    weights ``training.recipes.train_draft(init=...)`` takes), its draft vocabulary or None)``; the vocabulary is
    exported with the result (``save_draft_model(vocab_ids=...)``), so the fine-tune proposes the same tokens."""
    return load_draft_model(folder, target_params, full_vocab=True), draft_vocab_of(folder)


def _load(folder: Path, target_params: dict | None, dtype) -> tuple[ModelConfig, dict]:
    try:
        conf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {folder}/config.json: {e}") from e
    if not conf.get("specjax_shared_embeddings"):
        return load_model(folder, dtype) if dtype is not None else load_model(folder)
    if target_params is None:
        raise ValueError(f"{folder} shares the target's embedding: pass target_params to load_draft_model")
    cfg = config_from_hf(conf, str(folder / "config.json"))
    shared = {"model.embed_tokens.weight": np.asarray(target_params["embed"])}
    if not cfg.tie_embeddings:
        shared["lm_head.weight"] = np.asarray(target_params["lm_head"])
    dtype = dtype if dtype is not None else np.asarray(target_params["embed"]).dtype
    steps = namemap.plan("hf", cfg)
    try:
        with safe_open(folder / SINGLE, framework="numpy") as f:
            shapes = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()} | {n: x.shape for n, x in shared.items()}
            namemap.check(steps, shapes, set(), str(folder))
            return cfg, build_params(steps, lambda n: shared[n] if n in shared else f.get_tensor(n), cfg, dtype)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"reading {folder}/{SINGLE} failed (missing, truncated or corrupt?): {e}") from e
