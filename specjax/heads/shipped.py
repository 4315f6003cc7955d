"""Trained heads and draft models shipped inside the package (``specjax/shipped/<model>/<kind>/``).

Each folder holds the checkpoint (EAGLE-3: vLLM/SGLang layout; Medusa: the Medusa repository's
layout with the LM head shared; draft: a slim HF folder sharing the target's embedding) and a
``CARD.md`` (data, steps, hardware, measured tau). ``load`` returns a config and the params the
drafters take as ``draft_params``; ``training/train_smollm2.py`` made them.
"""

from __future__ import annotations

from pathlib import Path

from specjax.config import ModelConfig
from specjax.errors import AssetsMissing
from specjax.heads import draft_io, eagle3_io, medusa_io

ROOT = Path(__file__).resolve().parent.parent / "shipped"
KINDS = ("eagle3", "medusa", "draft")


def path(model: str, kind: str) -> Path:
    if kind not in KINDS:
        raise ValueError(f"unknown shipped kind {kind!r}; expected one of {KINDS}")
    folder = ROOT / model / kind
    if not (folder / "config.json").is_file():
        have = sorted(p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("*/*/config.json"))
        raise AssetsMissing(f"no shipped {kind} for {model!r} (looked in {folder}); shipped: {have or 'none'}. "
                            "Train one with `python -m training.train_smollm2`")
    return folder


def load(model: str, kind: str, target_cfg: ModelConfig, target_params: dict, dtype=None):
    """``(config, draft_params)`` of a shipped head or draft model: an ``Eagle3Config`` with
    ``{"params", "draft_ids"}``, a ``MedusaConfig`` with the heads' params, or a draft model's
    ``ModelConfig`` with its params (embedding taken from ``target_params``). Wrap the config in
    ``drafters.Eagle3`` / ``drafters.Medusa`` / ``drafters.DraftModel``."""
    folder = path(model, kind)
    dtype = dtype if dtype is not None else target_params["embed"].dtype
    if kind == "eagle3":
        cfg, params, ids = eagle3_io.load_eagle3(folder, target=target_cfg, dtype=dtype)
        return cfg, {"params": params, "draft_ids": ids}
    if kind == "medusa":
        return medusa_io.load_medusa(folder, target_cfg, dtype=dtype)
    return draft_io.load_draft_model(folder, target_params, dtype)
