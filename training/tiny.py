"""A tiny random target with a byte-level tokenizer and a ChatML template, for CPU tests and demos.

Token ids 0..255 are bytes (GPT-2 byte-level alphabet, no merges); 256..258 are
``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` (the EOS). Everything downstream (corpus,
training, export, decoding) runs unchanged on it, in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from specjax import config, model
from specjax.config import ModelConfig
from specjax.loading import export_hf
from specjax.tokenizer import Tokenizer

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokenizer() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = HFTokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, [], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    return Tokenizer(backend, CHATML, None, (258,), {"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"})


def save_hf(folder: str | Path, seed: int = 0) -> Path:
    """The tiny target as an HF folder (weights + tokenizer.json + chat template) that ``specjax.load`` reads."""
    folder = Path(folder)
    cfg, tp = target(seed)
    export_hf(tp, cfg, folder)
    tokenizer().backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"}))
    return folder


def target_config(n_layers: int = 4, max_seq_len: int = 1024) -> ModelConfig:
    return config.tiny(vocab_size=259, n_layers=n_layers, eos_token_ids=(258,), bos_token_id=256,
                       max_seq_len=max_seq_len)


def target(seed: int = 0, n_layers: int = 4, max_seq_len: int = 1024) -> tuple[ModelConfig, dict]:
    """A random 4-layer llama over the tiny tokenizer's 259 ids (EOS = <|im_end|>)."""
    cfg = target_config(n_layers, max_seq_len)
    return cfg, model.init_params(cfg, jax.random.key(seed), scale=0.1)


def eagle3_head(cfg: ModelConfig, tp: dict, draft_vocab: int = 96, seed: int = 1):
    """A random EAGLE-3 head over a random draft vocabulary of ``draft_vocab`` target ids (LM head rows and
    final norm from the target): ``(Eagle3Config, {"params", "draft_ids"})``, what ``drafters.Eagle3`` takes."""
    import jax.numpy as jnp
    import numpy as np

    from specjax.heads import eagle3
    ecfg = eagle3.Eagle3Config(cfg, draft_vocab_size=draft_vocab)
    ids = jnp.asarray(np.sort(np.random.default_rng(seed - 1).choice(cfg.vocab_size, draft_vocab, replace=False)),
                      jnp.int32)
    return ecfg, {"params": eagle3.init_params(ecfg, jax.random.key(seed), tp, ids, scale=0.1), "draft_ids": ids}


def medusa_heads(cfg: ModelConfig, num_heads: int = 3, seed: int = 2):
    """Random Medusa heads (residual blocks of small random weights, the target's LM head shared):
    ``(MedusaConfig, params)``, what ``drafters.Medusa`` takes."""
    from specjax.heads import medusa
    mcfg = medusa.MedusaConfig(cfg, num_heads=num_heads)
    return mcfg, jax.tree.map(lambda x: 0.05 * jax.random.normal(jax.random.key(seed), x.shape),
                              medusa.init_params(mcfg))
