"""Name or path -> a ready model bundle: config, params and tokenizer; prompts -> token ids."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax.numpy as jnp

from specjax import assets
from specjax.config import ModelConfig, check_compute_dtype
from specjax.loading import load_gguf, load_hf
from specjax.loading.gguf_file import open_reader
from specjax.tokenizer import Tokenizer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedModel:
    cfg: ModelConfig
    params: dict
    tokenizer: Tokenizer
    path: Path

    def encode(self, text: str, chat: bool = False) -> list[int]:
        """One prompt -> ids; with ``chat`` it becomes a user turn in the model's chat template."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("empty prompt: expected a non-empty string")
        if chat:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True)
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def load(name_or_path: str | os.PathLike = "smollm2-135m-instruct", dtype: str = "float32",
         compute_dtype: str = "param") -> LoadedModel:
    """Load a registered model name (fetched with `specjax fetch`), a .gguf file or an HF folder.

    ``dtype`` is the weights' (and KV cache's) dtype; ``compute_dtype`` the matmul operand dtype,
    "param" (the weight dtype, fast) or "float32" (bf16 weights upcast inside each product: slower,
    but bf16 greedy speculative output keeps AR's tokens far more often), see ``ModelConfig``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    check_compute_dtype(compute_dtype)  # before reading any file
    path = assets.resolve_model(name_or_path)
    if path.suffix == ".gguf":
        assets.verify_gguf(path)
        reader = open_reader(path)  # parsed once, shared by tokenizer and weights
        tok = Tokenizer.from_gguf(path, reader=reader)
        cfg, params = load_gguf(path, DTYPES[dtype], reader=reader)
    else:
        tok = Tokenizer.from_hf_dir(path)
        cfg, params = load_hf(path, DTYPES[dtype])
    if tok.eos_token_ids and not cfg.eos_token_ids:
        cfg = cfg.replace(eos_token_ids=tuple(tok.eos_token_ids))
    cfg = cfg.replace(compute_dtype=compute_dtype)
    return LoadedModel(cfg=cfg, params=params, tokenizer=tok, path=path)
