"""Drafters behind one protocol (``base.Drafter``): one file each; ``build`` maps CLI options to one."""

from __future__ import annotations

from typing import Any

from specjax.config import ModelConfig
from specjax.speculative.drafters.base import Context, Drafter, Prefill, Proposal, Verified, draw
from specjax.speculative.drafters.draft_model import DraftModel
from specjax.speculative.drafters.layerskip import LayerSkip
from specjax.speculative.drafters.ngram import NGram

METHODS = ("draft", "layerskip", "ngram")

__all__ = ["Context", "Drafter", "DraftModel", "LayerSkip", "METHODS", "NGram", "Prefill", "Proposal", "Verified",
           "build", "draw"]


def build(method: str, cfg: ModelConfig, *, draft_model=None, draft_dtype=None, layerskip_layers: int | None = None,
          exit_head: dict | None = None, ngram_min: int = 1, ngram_max: int = 3) -> tuple[Drafter, Any]:
    """``(drafter, draft_params)`` for a method name, as the CLI's options describe it.

    ``draft_model``: a path (.gguf or HF folder) or an already loaded ``(ModelConfig, params)`` pair.
    ``layerskip_layers`` defaults to half the target's depth.
    """
    if method == "draft":
        if draft_model is None:
            raise ValueError("method 'draft' needs a draft model (--draft-model PATH)")
        if isinstance(draft_model, tuple):
            dcfg, dparams = draft_model
        else:
            from specjax.loading import load_model
            kw = {} if draft_dtype is None else {"dtype": draft_dtype}
            dcfg, dparams = load_model(draft_model, **kw)
        if dcfg.vocab_size != cfg.vocab_size:
            raise ValueError(f"draft model vocabulary ({dcfg.vocab_size} tokens) differs from the target's "
                             f"({cfg.vocab_size}); a draft model must share the target's tokenizer and vocabulary")
        return DraftModel(dcfg), dparams
    if method == "layerskip":
        n = max(1, cfg.n_layers // 2) if layerskip_layers is None else int(layerskip_layers)
        return LayerSkip(n), exit_head
    if method == "ngram":
        return NGram(int(ngram_min), int(ngram_max)), None
    raise ValueError(f"unknown speculative method {method!r}; expected one of {', '.join(METHODS)}")
