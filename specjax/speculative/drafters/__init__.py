"""Drafters behind one protocol (``base.Drafter``): one file each; ``build`` maps CLI options to one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specjax.config import ModelConfig
from specjax.speculative.drafters.base import Context, Drafter, Prefill, Proposal, Verified, draw
from specjax.speculative.drafters.draft_model import DraftModel
from specjax.speculative.drafters.layerskip import LayerSkip
from specjax.speculative.drafters.ngram import NGram
from specjax.speculative.tree import Tree

METHODS = ("draft", "layerskip", "ngram", "eagle3", "medusa")
TREE_METHODS = ("draft", "eagle3", "medusa")
SHIPPED_TARGET = "smollm2-135m-instruct"  # whose shipped heads eagle3/medusa use without --draft-model

__all__ = ["Context", "Drafter", "DraftModel", "LayerSkip", "METHODS", "NGram", "Prefill", "Proposal", "Tree",
           "Verified", "build", "draw"]


def _load_draft_model(draft_model, target_params, dtype):
    if isinstance(draft_model, tuple):
        return draft_model
    path = Path(draft_model).expanduser()
    if path.is_dir():  # an HF folder, or a slim one sharing the target's embedding
        from specjax.heads.draft_io import load_draft_model
        return load_draft_model(path, target_params, dtype)
    from specjax.loading import load_model
    return load_model(path, **({} if dtype is None else {"dtype": dtype}))


def _shipped_draft(cfg: ModelConfig, target_params, dtype):
    """The distilled draft model shipped for SmolLM2-135M-Instruct (it shares that target's embedding)."""
    import json

    from specjax.heads import shipped
    conf = json.loads((shipped.path(SHIPPED_TARGET, "draft") / "config.json").read_text())
    if (conf["hidden_size"], conf["vocab_size"]) != (cfg.d_model, cfg.vocab_size):
        raise ValueError(f"the shipped draft model is made for {SHIPPED_TARGET} (d_model {conf['hidden_size']}, "
                         f"vocabulary {conf['vocab_size']}); this target has d_model {cfg.d_model}, vocabulary "
                         f"{cfg.vocab_size}: pass --draft-model PATH")
    return shipped.load(SHIPPED_TARGET, "draft", cfg, target_params, dtype)


def _tree(tree, method: str, folder: Path | None) -> Tree | None:
    """A ``Tree``; an int N: the N-node tree fitted for this head or draft model (``trees.json`` in its folder); a
    path: a JSON list of rank paths."""
    if tree is None or isinstance(tree, Tree):
        return tree
    if isinstance(tree, (int, np.integer)) and not isinstance(tree, bool):
        if folder is None:
            raise ValueError(f"--tree {tree}: a draft model passed as loaded params has no folder of fitted trees; "
                             "pass a Tree or a JSON file of rank paths, e.g. [[0], [1], [0, 0]]")
        if not (folder / "trees.json").is_file():
            raise ValueError(f"--tree {tree}: the head in {folder} has no fitted trees (trees.json); pass a JSON file "
                             "of rank paths, e.g. [[0], [1], [0, 0]]")
        return Tree.load(folder / "trees.json", int(tree), method)
    path = Path(tree).expanduser()
    if not path.is_file():
        raise ValueError(f"tree must be a node count of a fitted tree, a JSON file of rank paths or a Tree, "
                         f"got {tree!r}")
    return Tree.load(path)


def _load_heads(method: str, draft_model, cfg: ModelConfig, target_params, dtype, tree=None):
    from specjax.heads import eagle3_io, medusa_io, shipped
    from specjax.speculative.drafters.eagle3 import Eagle3
    from specjax.speculative.drafters.medusa import Medusa
    if draft_model is None:
        folder = shipped.path(SHIPPED_TARGET, method)
        hcfg, dp = shipped.load(SHIPPED_TARGET, method, cfg, target_params, dtype)
    elif method == "eagle3":
        folder = Path(draft_model).expanduser()
        hcfg, params, ids = eagle3_io.load_eagle3(draft_model, target=cfg, dtype=dtype)
        dp = {"params": params, "draft_ids": ids}
    else:
        folder = Path(draft_model).expanduser()
        hcfg, dp = medusa_io.load_medusa(draft_model, cfg, dtype=dtype)
    return (Eagle3 if method == "eagle3" else Medusa)(hcfg, _tree(tree, method, folder)), dp


def build(method: str, cfg: ModelConfig, *, target_params: dict | None = None, draft_model=None, draft_dtype=None,
          layerskip_layers: int | None = None, exit_head: dict | None = None, ngram_min: int = 1,
          ngram_max: int = 3, tree=None, min_confidence: float = 0.0) -> tuple[Drafter, Any]:
    """``(drafter, draft_params)`` for a method name, as the CLI's options describe it.

    ``draft_model``: for ``draft``, a path (.gguf, HF folder, or a slim folder sharing the target's
    embedding) or a loaded ``(ModelConfig, params)`` pair; for ``eagle3``/``medusa``, a head folder
    (default for all three: the draft model / head shipped for SmolLM2-135M-Instruct). Loaded in ``draft_dtype`` (default: the
    target's). ``layerskip_layers`` defaults to half the depth. ``tree`` (draft, eagle3, medusa): a ``Tree``, a node
    count N (the N-node tree fitted for the head or draft model, from ``trees.json`` in its folder; a .gguf's
    folder) or a JSON file of rank paths.
    ``min_confidence`` (draft): an adaptive chain, each row stopping after a draft below that probability.
    """
    if method not in METHODS:
        raise ValueError(f"unknown speculative method {method!r}; expected one of {', '.join(METHODS)}")
    if tree is not None and method not in TREE_METHODS:
        raise ValueError(f"draft trees are drafted by {', '.join(TREE_METHODS)}, not {method!r}")
    if min_confidence and method != "draft":
        raise ValueError(f"min_confidence (an adaptive chain) is an option of the draft method, not {method!r}")
    if draft_dtype is None and target_params is not None:
        draft_dtype = target_params["embed"].dtype
    if method == "draft":
        if draft_model is None:
            from specjax.heads import shipped
            folder = shipped.path(SHIPPED_TARGET, "draft")
            dcfg, dparams = _shipped_draft(cfg, target_params, draft_dtype)
        else:
            folder = None if isinstance(draft_model, tuple) else Path(draft_model).expanduser()
            folder = folder if folder is None or folder.is_dir() else folder.parent
            dcfg, dparams = _load_draft_model(draft_model, target_params, draft_dtype)
        if dcfg.vocab_size != cfg.vocab_size:
            raise ValueError(f"draft model vocabulary ({dcfg.vocab_size} tokens) differs from the target's "
                             f"({cfg.vocab_size}); a draft model must share the target's tokenizer and vocabulary")
        return DraftModel(dcfg, min_confidence=min_confidence, tree=_tree(tree, "draft", folder)), dparams
    if method == "layerskip":
        n = max(1, cfg.n_layers // 2) if layerskip_layers is None else int(layerskip_layers)
        return LayerSkip(n), exit_head
    if method == "ngram":
        return NGram(int(ngram_min), int(ngram_max)), None
    return _load_heads(method, draft_model, cfg, target_params, draft_dtype, tree)
