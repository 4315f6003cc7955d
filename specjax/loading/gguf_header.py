"""A GGUF file's parsed header, kept as JSON in specjax's cache so that the next load skips the parse.

``gguf.GGUFReader`` parses every metadata string into numpy views of its own: SmolLM2's 49152 tokens and
48900 merges take it ~9-11 s on one CPU core, four times what dequantizing all the weights takes. The cache
holds what the loaders read from a reader: each metadata field's value (``contents()``) and the tensor
index (name, GGML type, dims, data offset). Tensor data is still read from the GGUF file itself.

An entry lives in ``$SPECJAX_HOME/cache/gguf/``, is named after the file's resolved path, and is used only
while the file's header bytes (everything before the tensor data: a sha256 of ~2 MB, milliseconds) and its size
are those it was written for, under the same gguf version and ``FORMAT``; otherwise the file is parsed again and
the entry rewritten (atomically). Headers under
``MIN_HEADER_BYTES`` (no real vocabulary: the tests' tiny files) parse in milliseconds and are not cached.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import gguf
import numpy as np

from specjax.assets import home
from specjax.files import atomic_write_text

FORMAT = 1
MIN_HEADER_BYTES = 1 << 20
_PLAIN = {gguf.GGMLQuantizationType.F16: np.float16, gguf.GGMLQuantizationType.F32: np.float32,
          gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
          gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
          gguf.GGMLQuantizationType.I64: np.int64}


class Field(NamedTuple):
    """A metadata field as the loaders use it: ``contents()``."""
    value: Any

    def contents(self) -> Any:
        return self.value


class Tensor(NamedTuple):
    """The ``gguf.ReaderTensor`` fields the loaders read; ``data`` maps the file as the reader does."""
    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: np.ndarray  # GGUF order, fastest dim first
    n_bytes: int
    data_offset: int
    data: np.ndarray


class Header(NamedTuple):
    """Stands in for a ``gguf.GGUFReader`` where only ``fields``, ``tensors`` and ``data_offset`` are read."""
    fields: dict[str, Field]
    tensors: list[Tensor]
    data_offset: int


def entry_path(path: str | os.PathLike) -> Path:
    resolved = str(Path(path).resolve())
    key = hashlib.sha256(resolved.encode()).hexdigest()[:16]
    return home() / "cache" / "gguf" / f"{Path(resolved).stem}-{key}.json"


def _stamp(path, data_offset: int) -> dict:
    """What an entry is valid for: the header's bytes (what it was parsed from), the file's size, the parser."""
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read(data_offset)).hexdigest()
    return {"format": FORMAT, "gguf": importlib.metadata.version("gguf"), "size": os.path.getsize(path),
            "header_sha256": digest}


def read(path: str | os.PathLike) -> Header | None:
    """The cached header of ``path``, or None (no entry, a stale or unreadable one)."""
    try:
        doc = json.loads(entry_path(path).read_text(encoding="utf-8"))
        if doc.get("stamp") != _stamp(path, doc["data_offset"]):
            return None
        mm = np.memmap(path, np.uint8, mode="r")
        tensors = []
        for name, kind, dims, n_bytes, offset in doc["tensors"]:
            kind = gguf.GGMLQuantizationType(kind)
            shape = tuple(reversed(dims))
            if kind not in _PLAIN:  # quantized: rows of blocks' bytes, as the reader gives them
                shape = gguf.quants.quant_shape_to_byte_shape(shape, kind)
            data = mm[offset:offset + n_bytes].view(_PLAIN.get(kind, np.uint8)).reshape(shape)
            tensors.append(Tensor(name, kind, np.asarray(dims, np.uint64), n_bytes, offset, data))
        return Header({k: Field(v) for k, v in doc["fields"].items()}, tensors, doc["data_offset"])
    except (OSError, ValueError, KeyError, TypeError):  # no entry, or one this code cannot use: parse again
        return None


def write(path: str | os.PathLike, reader: gguf.GGUFReader) -> bool:
    """Keeps ``reader``'s header for the next load when it is large enough to be worth it; whether it did.
    A cache that cannot be written (read-only home) only costs the next load its parse."""
    if reader.data_offset < MIN_HEADER_BYTES:
        return False
    doc = {"stamp": _stamp(path, int(reader.data_offset)), "data_offset": int(reader.data_offset),
           "fields": {k: f.contents() for k, f in reader.fields.items()},
           "tensors": [(t.name, int(t.tensor_type), [int(n) for n in t.shape.tolist()], int(t.n_bytes),
                        int(t.data_offset)) for t in reader.tensors]}
    try:
        atomic_write_text(entry_path(path), json.dumps(doc, ensure_ascii=False))
    except OSError:
        return False
    return True
