"""Tokenizer: a HF `tokenizers.Tokenizer` plus the checkpoint's own Jinja chat template.

`from_gguf` rebuilds the byte-level BPE from GGUF metadata (`tokenizer.ggml.*`), choosing the
pre-tokenizer from `tokenizer.ggml.pre` the way llama.cpp does (e.g. "smollm" splits digits
individually before the GPT-2 regex, as SmolLM2's own tokenizer.json does). `from_hf_dir` reads
tokenizer.json + tokenizer_config.json. Chat templates render in a sandboxed jinja2 environment
with the same helpers transformers provides (`raise_exception`, `tojson`, `strftime_now`).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, processors

from specjax.loading.gguf_file import open_reader

# llama.cpp pre-tokenizer names -> HF pre-tokenizer (GPT-2 regex inside ByteLevel).
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "codeshell", "exaone", "minerva", "command-r"}
_GPT2 = {"default", "gpt2", "gpt-2", "mpt", "olmo", "jais"}
_CONTROL, _USER_DEFINED = 3, 4  # gguf token_type values


def _pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _GPT2:
        return byte_level
    raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r}; supported: {sorted(_DIGITS_THEN_GPT2 | _GPT2)}")


@functools.lru_cache(maxsize=8)
def _compile_template(source: str) -> jinja2.Template:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@dataclass(frozen=True, eq=False)
class Tokenizer:
    backend: HFTokenizer
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # any of these ends generation
    special_tokens: dict  # bos_token / eos_token / pad_token / unk_token strings, for templates

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, reader=None) -> Tokenizer:
        """Build from GGUF metadata; pass an open ``reader`` (``open_reader``'s) to avoid opening the header twice."""
        reader = open_reader(path) if reader is None else reader

        def field(key, default=None):
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        if (kind := field("tokenizer.ggml.model")) != "gpt2":
            raise ValueError(f"{path}: tokenizer.ggml.model is {kind!r}; only 'gpt2' (byte-level BPE) is supported")
        tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
        merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
        backend = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
        backend.pre_tokenizer = _pre_tokenizer(field("tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                    for t, k in zip(tokens, types) if k == _CONTROL])
        backend.add_tokens([AddedToken(t, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED])
        ids = {n: field(f"tokenizer.ggml.{n}_token_id") for n in ("bos", "eos", "padding", "unknown", "eot", "eom")}
        if field("tokenizer.ggml.add_bos_token", False) and ids["bos"] is not None:
            bos = tokens[ids["bos"]]
            backend.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A $B:1", special_tokens=[(bos, ids["bos"])])
        names = {"bos": "bos_token", "eos": "eos_token", "padding": "pad_token", "unknown": "unk_token"}
        special = {names[n]: tokens[i] for n, i in ids.items() if n in names and i is not None}
        eos = tuple(dict.fromkeys(i for n, i in ids.items() if n in ("eos", "eot", "eom") and i is not None))
        return cls(backend, field("tokenizer.chat_template"), ids["bos"], eos, special)

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike) -> Tokenizer:
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json (expected a HF checkpoint folder)")
        backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
        cfg = _read_json(path / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        elif isinstance(template, list):  # [{"name": ..., "template": ...}]
            template = {t["name"]: t["template"] for t in template}.get("default")
        special = {k: v["content"] if isinstance(v, dict) else v for k, v in cfg.items()
                   if k in ("bos_token", "eos_token", "pad_token", "unk_token") and v is not None}
        gen_eos = _read_json(path / "generation_config.json").get("eos_token_id")
        eos = [backend.token_to_id(special["eos_token"])] if "eos_token" in special else []
        eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
        bos = backend.token_to_id(special["bos_token"]) if "bos_token" in special else None
        return cls(backend, template, bos, tuple(dict.fromkeys(i for i in eos if i is not None)), special)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token strings in it (e.g. "<|im_end|>") map to their ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.decode_batch([ids], skip_special_tokens)[0]

    def decode_batch(self, seqs, skip_special_tokens: bool = True) -> list[str]:
        """``decode`` of each id sequence, in one call into the backend (which decodes them in parallel)."""
        seqs, vocab = [[int(i) for i in ids] for ids in seqs], self.vocab_size
        for ids in seqs:
            if ids and not (0 <= min(ids) and max(ids) < vocab):
                bad = [i for i in ids if not 0 <= i < vocab]
                raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        return self.backend.decode_batch(seqs, skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The chat template rendered to text (what `apply_chat_template` tokenizes)."""
        if self.chat_template is None:
            raise ValueError("this checkpoint has no chat template; build prompts with encode() instead")
        if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        return _compile_template(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens, **kwargs)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> list[int]:
        """Token ids of the rendered chat (the template carries its own special tokens)."""
        return self.encode(self.render_chat(messages, add_generation_prompt, **kwargs), add_special_tokens=False)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
